"""No-op consumers the drain benchmark runs (registered when the bench app is installed)."""

from __future__ import annotations

import sqlqueue

TOPIC = "bench.drain"


@sqlqueue.consumer(TOPIC, group="bench-unordered")
def unordered(message: sqlqueue.Message) -> None:
    return None


@sqlqueue.consumer(TOPIC, group="bench-ordered", ordered=True)
def ordered(message: sqlqueue.Message) -> None:
    return None
