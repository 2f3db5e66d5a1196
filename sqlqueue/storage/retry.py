"""Trying a transaction again after the database rolled it back as a lock-wait or
deadlock victim: nothing of it was stored, so running it again is safe.

One loop for both sides that need it, below them and without Django: publishing
outside a transaction of the caller's (``sqlqueue.publishing.api``) and the Spark
writer's chunks (``sqlqueue.integrations.spark.writer``). Each says which errors are
victims (its driver's codes) and how long to pause between tries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


def retry_victims(
    attempt: Callable[[], _T], *, tries: int, is_victim: Callable[[Exception], bool],
    pause: Callable[[int], float],
    on_retry: Callable[[Exception, int], None] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> _T:
    """``attempt()``, run again (at most ``tries`` times in all) while it raises an error
    ``is_victim`` recognises; any other error, or the last try's, is raised. Before try
    n + 1 (n from 1): ``on_retry(error, n)``, then ``sleep(pause(n))`` (``time.sleep``
    unless given one: a test passes one that only records)."""
    for tried in range(1, tries + 1):
        try:
            return attempt()
        except Exception as error:
            if tried >= tries or not is_victim(error):
                raise
            if on_retry is not None:
                on_retry(error, tried)
        (sleep or time.sleep)(pause(tried))
    raise ValueError(f"tries must be at least 1, not {tries}")
