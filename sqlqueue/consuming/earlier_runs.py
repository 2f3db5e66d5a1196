"""Ordered partitions taken in a new tenure: until when a delivery made under an earlier
lease may still run (guarantee I5). Its holder may have lost the lease while its handler
ran on (frozen, cut off from the database): the run is not this process's to see, only
its delivery state is. ``Subscriber`` owns one ``EarlierRuns``; runs on the runner's main
thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from django.db.backends.utils import CursorWrapper

from sqlqueue.consuming.partition import PartitionState
from sqlqueue.storage.protocols import DeliveryStore

logger = logging.getLogger("sqlqueue.consumer")


class EarlierRuns:
    """Read once a tenure (for every partition gained, in one ``runs_in_flight``); a view
    rebuilt in the same tenure (after a lost lock wait) keeps what was read then, so that
    the subscriber's own deliveries since never count as someone else's."""

    def __init__(self, group: str, topic: str, clock: Callable[[], int]) -> None:
        self.group = group
        self.topic = topic
        self.clock = clock
        #: partition -> (tenure, until when an earlier lease's delivery may run)
        self._read: dict[str, tuple[int | None, int]] = {}

    def wait_for(self, cursor: CursorWrapper, store: DeliveryStore, fresh: list[PartitionState],
                 owned: Collection[str]) -> None:
        """Each of the ``fresh`` states (just built) starts nothing before the runs of
        earlier leases of its partition end (``PartitionState.wait_for_earlier_runs``)."""
        if not fresh:
            return
        self._read = {key: run for key, run in self._read.items() if key in owned}
        unread = [state for state in fresh
                  if self._read.get(state.partition_key, (None, 0))[0] != state.tenure]
        if unread:
            found = store.runs_in_flight(
                cursor, self.group, self.topic,
                [(state.partition_key, state.watermark) for state in unread])
            for state in unread:
                key = state.partition_key
                self._read[key] = (state.tenure, found.get(key, 0))
                if key in found:
                    logger.info("%s/%s: a delivery made under an earlier lease may still "
                                "run for %.1fs; the ordered partition starts nothing before.",
                                self.topic, key, max(0, found[key] - self.clock()) / 1000)
        for state in fresh:
            state.wait_for_earlier_runs(self._read[state.partition_key][1])

    def forget(self) -> None:
        """Another server: nothing read on the old one holds."""
        self._read.clear()
