"""Schedules kept in the database (``queue_stored_schedules``, issue 42) besides
``SQLQUEUE["SCHEDULES"]``: checked like the setting's entries, and reloaded by every
``runconsumer`` every ``RELOAD_INTERVAL_MS`` (one small read), so that one created,
edited, paused or deleted in the admin takes effect within seconds, without a deploy.

Whoever may edit stored schedules may publish through them (issue 53, W2): their topic
must match ``SQLQUEUE["SCHEDULE_TOPICS"]`` and may never be a Tasks backend's (a forged
task envelope there would run as a task), and their task must be a registered ``@task``,
never a path to import (W1). The runners check each row again as they load it.

Each tick is still claimed through the schedule's ``queue_schedules`` row (the ticker's
compare-and-set), so it is published exactly once however many runners run. A stored
schedule's name may not be one of the setting's: the setting's would win.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.db import Error as AnyDatabaseError

from sqlqueue.conf import QueueSettings, get_settings
from sqlqueue.models import StoredSchedule
from sqlqueue.scheduling.definitions import Schedule, ScheduleError, parse_schedule
from sqlqueue.scheduling.targets import owning_target
from sqlqueue.scheduling.ticker import Published, Ticker
from sqlqueue.scheduling.validation import check_schedule

logger = logging.getLogger("sqlqueue.schedules")

#: how often a runner reads the stored schedules again (database clock, milliseconds)
RELOAD_INTERVAL_MS = 5_000


def checked_schedule(name: Any, entry: Any, conf: QueueSettings | None = None) -> Schedule:
    """A stored schedule's entry, checked as a setting's entry is (shape, topic, payload,
    task), and its name not taken by the setting. Raises ``ScheduleError``."""
    conf = conf or get_settings()
    schedule = parse_schedule(name, entry)
    if schedule.name in dict(conf.SCHEDULES):
        raise ScheduleError("sqlqueue.E301", f"A schedule named {schedule.name!r} is in "
                                             "SQLQUEUE['SCHEDULES'] already: choose another "
                                             "name.")
    return usable_schedule(schedule, conf)


def usable_schedule(schedule: Schedule, conf: QueueSettings) -> Schedule:
    """A parsed stored schedule if it may run: checked as a setting's (its task a
    registered one, its message publishable), and its topic one a stored schedule may
    publish to. Raises ``ScheduleError``."""
    if schedule.topic is not None:
        check_stored_topic(schedule, conf)
    check_schedule(schedule, conf)
    return schedule


def check_stored_topic(schedule: Schedule, conf: QueueSettings) -> None:
    """A stored schedule's topic: never a Tasks backend's (its messages run as tasks),
    and matched by ``SQLQUEUE["SCHEDULE_TOPICS"]``."""
    topic = str(schedule.topic)
    where = f"SQLQUEUE['SCHEDULES'][{schedule.name!r}]['topic'] {topic!r}"
    if owning_target(topic) == "task":
        raise ScheduleError("sqlqueue.E307", f"{where} is a topic of a Tasks backend: its "
                                             "messages run as tasks. Choose the task instead "
                                             "(a task schedule).", "topic")
    if not conf.allows_schedule_topic(topic):
        allowed = ", ".join(conf.SCHEDULE_TOPICS) or "none"
        raise ScheduleError("sqlqueue.E307", f"{where} is not one a stored schedule may "
                                             "publish to: SQLQUEUE['SCHEDULE_TOPICS'] allows "
                                             f"{allowed}.", "topic")


def active_stored_schedules(conf: QueueSettings | None = None) -> list[Schedule]:
    """The stored schedules not paused, each checked again (a row written by hand, a
    task removed since, a topic no longer allowed): one that does not pass is left out
    with a warning."""
    conf = conf or get_settings()
    taken = set(dict(conf.SCHEDULES))
    schedules = []
    for name, entry in (StoredSchedule.objects.using(conf.DATABASE).filter(paused=False)
                        .order_by("name").values_list("name", "entry")):
        if name in taken:
            continue
        try:
            schedules.append(usable_schedule(parse_schedule(name, entry), conf))
        except ScheduleError as error:
            logger.warning("Stored schedule %s is not usable and publishes nothing: %s",
                           name, error)
    return schedules


class ReloadingTicker(Ticker):
    """A ``Ticker`` of the setting's schedules and the stored ones, reading the stored
    ones again every ``reload_ms``."""

    def __init__(self, configured: Iterable[Schedule], clock: Callable[[], int],
                 conf: QueueSettings | None = None,
                 reload_ms: int = RELOAD_INTERVAL_MS) -> None:
        super().__init__(configured, clock, conf)
        self.configured = {s.name: s for s in configured}
        self.reload_ms = reload_ms
        self._reload_at = 0

    def next_due_ms(self) -> int | None:
        due = super().next_due_ms()
        return self._reload_at if due is None else min(due, self._reload_at)

    def run_due(self) -> list[Published]:
        now = self.clock()
        if now >= self._reload_at:
            self._reload_at = now + self.reload_ms
            try:
                self.use({**self.configured,
                          **{s.name: s for s in active_stored_schedules(self.conf)
                             if s.name not in self.configured}})
            except AnyDatabaseError as exc:  # keep what was loaded; try at the next reload
                logger.warning("Could not read the stored schedules (%s).", exc)
        return super().run_due()

    def use(self, schedules: Mapping[str, Schedule]) -> None:
        """Tick ``schedules`` from now on: a new or changed one is looked at now (its row
        read again), a removed or paused one no more."""
        for name in set(self.schedules) - set(schedules):
            del self.schedules[name]
            self._due_at.pop(name, None)
            self._checked.pop(name, None)
        for name, schedule in schedules.items():
            if self.schedules.get(name) != schedule:
                self.schedules[name] = schedule
                self._due_at[name] = 0
                self._checked.pop(name, None)
