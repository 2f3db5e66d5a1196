"""What a runner reports about its own work (``runconsumer --metrics-port``).

The runner calls an ``Instruments`` at a few points; this base class does nothing, so the
runner needs no metrics library. ``sqlqueue.metrics.ProcessMetrics`` records into
Prometheus counters and histograms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlqueue.conf import DURATION_BUCKETS as DURATION_BUCKETS

if TYPE_CHECKING:
    from sqlqueue.consuming.handlers import Delivery


class Instruments:
    def handled(self, group: str, topic: str, outcome: str, duration: float,
                latency: float) -> None:
        """A handler finished: ``outcome`` (ack, acked, retry, fail, reject), ``duration``
        seconds it ran, ``latency`` seconds from the message being due to its start."""

    def finished(self, delivery: Delivery, outcome: str, duration: float) -> None:
        """The same handler run, for what needs the message itself (its attempt, when
        it was published): called right after ``handled``, with the same values."""

    def polled(self, group: str, topic: str, delivered: int) -> None:
        """One pass over a subscription handed out ``delivered`` messages."""

    def batch(self, group: str, topic: str, size: int) -> None:
        """A batch consumer's handler was called once with ``size`` messages."""

    def statement(self) -> None:
        """The consumer loop's connection ran one SQL statement."""

    def leases_changed(self, group: str, topic: str, gained: int, lost: int) -> None:
        """Partitions this process started or stopped holding."""

    def reconnected(self) -> None:
        """The loop lost its database connection and opens a new one."""
