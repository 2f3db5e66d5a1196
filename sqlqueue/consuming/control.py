"""An operator's request that this runner stop (issue 42; sqlqueue.operations.runners
writes it): a runner timer (``Pacer.timers``) that reads the runner's own row of
``queue_runner_requests`` once per ``LEASE_RENEW_INTERVAL`` (one primary-key read: the
polls themselves cost nothing more), so a request is obeyed within one renew interval.

A request made before this runner started (for an earlier process of the same name) is
stamped obeyed and otherwise ignored. ``drain`` stops as SIGTERM does; ``stop`` also
stops without waiting for the running handlers (their messages come back after their
visibility timeout).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import Error as AnyDatabaseError
from django.db import connections

from sqlqueue import events, storage

if TYPE_CHECKING:
    from sqlqueue.consuming.runner import Runner

logger = logging.getLogger("sqlqueue.consumer")


class RunnerControl:
    """Reads the runner's request every ``interval_ms`` (database clock) and calls
    ``stop(at_once)`` when one made after ``started_ms`` is found."""

    def __init__(self, name: str, alias: str, now_ms: Callable[[], int], interval_ms: int,
                 stop: Callable[[bool], None]) -> None:
        self.name, self.alias = name, alias
        self._now_ms = now_ms
        self.interval_ms = interval_ms
        self._stop = stop
        self.started_ms: int | None = None
        self._next_ms = 0
        self.obeyed: str | None = None  # the action obeyed, once

    @classmethod
    def of(cls, runner: Runner) -> RunnerControl:
        """The control of a ``Runner``: drain is its ``stop()``; at once is its
        ``stop(at_once=True)`` (no time left for running handlers)."""
        control = cls(runner.name, runner.alias, runner.clock.now_ms,
                      int(runner.conf.LEASE_RENEW_INTERVAL * 1000),
                      lambda at_once: runner.stop(at_once=at_once))
        control.mark_start()
        return control

    def mark_start(self) -> None:
        """Before the runner's first heartbeat: a request for it (made once its name is
        seen live) comes after this, one for an earlier process of its name before."""
        try:
            self.started_ms = self._now_ms()
        except AnyDatabaseError:  # read at the first run instead
            self.started_ms = None

    def next_due_ms(self) -> int | None:
        return None if self.obeyed else self._next_ms

    def run_due(self) -> None:
        now = self._now_ms()
        if self.obeyed or now < self._next_ms:
            return
        self._next_ms = now + self.interval_ms
        if self.started_ms is None:
            self.started_ms = now
        connection = connections[self.alias]
        try:
            with connection.cursor() as cursor:
                store = storage.store(connection)
                request = store.runner_request(cursor, self.name)
                if request is None:
                    return
                action, by, at = request
                store.obey_runner_request(cursor, self.name, at)
        except AnyDatabaseError as exc:  # the consumer loop reconnects; try next time
            logger.debug("Could not read the runner's requests: %s", exc)
            return
        if at < self.started_ms:
            logger.info("%s: ignoring a request to %s made before it started (for an "
                        "earlier process of this name).", self.name, action)
            return
        self._obey(action, by, at)

    def _obey(self, action: str, by: str, at: int) -> None:
        self.obeyed = action
        what = "stop at once" if action == "stop" else "drain and stop"
        # The name as stored, quoted: a custom user model's username may hold anything.
        logger.warning(
            "%s: %s asked this runner to %s; %s.", self.name,
            f"the user {by!r}" if by else "an operator", what,
            "stopping now, without waiting for running handlers (their messages come "
            "back after their visibility timeout)" if action == "stop" else
            "finishing the running handlers, then stopping",
            extra=events.fields(events.RUNNER_STOP_REQUESTED, subscriber=self.name,
                                action=action, requested_by=by, requested_at=at))
        self._stop(action == "stop")
