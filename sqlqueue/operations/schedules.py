"""Schedules for operators: what is configured, when each ticks next, what it published
last and how each consumer group fared with it; publishing a tick now (the admin's
Schedules page and ``manage.py queue schedules``; docs/guides/schedules.md, "Seeing and
running schedules")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import connections, router, transaction

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage, StoredSchedule
from sqlqueue.operations.lag import known_subscriptions
from sqlqueue.scheduling import Schedule, configured_schedules
from sqlqueue.scheduling.stored import active_stored_schedules
from sqlqueue.scheduling.ticker import alias_for, publish_tick
from sqlqueue.storage.sql.schedules import PublishedTick, ScheduleRow


class UnknownSchedule(SqlqueueError, LookupError):
    """A name that is not in ``SQLQUEUE["SCHEDULES"]`` nor a stored schedule."""


@dataclass(frozen=True)
class ScheduleView:
    name: str
    #: None: a row left by a schedule no longer in the settings (it publishes nothing)
    schedule: Schedule | None
    row: ScheduleRow | None
    next_tick_ms: int | None
    #: consumer group -> what became of the last published message for it
    outcomes: dict[str, str] = field(default_factory=dict)
    #: "settings" (read-only here), "database" (edited in the admin), "" (removed)
    source: str = "settings"
    paused: bool = False
    #: the last message is still stored where the admin's message pages read (with the
    #: default RETENTION = 0 an acked tick is collected within seconds: no page to link)
    last_message_stored: bool = False

    @property
    def definition(self) -> str:
        if self.schedule is not None:
            return self.schedule.definition
        return self.row.definition if self.row else ""

    @property
    def target(self) -> str:
        if self.schedule is None:
            return "(paused)" if self.paused else "(removed from settings)"
        if self.schedule.task is not None:
            return f"task {self.schedule.task}"
        return f"topic {self.schedule.topic}"


def schedule_overview(now_ms: int) -> list[ScheduleView]:
    """Every schedule (the setting's, then the stored ones), then the rows of removed
    ones, by name. A paused stored schedule has no next tick."""
    conf = get_settings()
    schedules = {s.name: s for s in configured_schedules(conf)}
    stored = {name: (paused, entry) for name, paused, entry in StoredSchedule.objects.using(
        conf.DATABASE).values_list("name", "paused", "entry") if name not in schedules}
    active = {s.name: s for s in active_stored_schedules(conf)}
    every = {**active, **schedules}
    rows: dict[str, ScheduleRow] = {}
    messages_alias = router.db_for_read(QueueMessage)  # where the message pages read
    linkable: dict[str, ScheduleRow] = {}
    for alias in sorted({alias_for(s, conf) for s in every.values()} | {conf.DATABASE}):
        with connections[alias].cursor() as cursor:
            found = storage.store(alias).read_schedules(cursor)
        rows.update(found)
        if alias == messages_alias:
            linkable.update(found)
    stored_offsets = _still_stored(linkable.values(), messages_alias)
    views = []
    for name in sorted(set(every) | set(stored) | set(rows)):
        schedule, row = every.get(name), rows.get(name)
        source = "settings" if name in schedules else "database" if name in stored else ""
        views.append(ScheduleView(
            name, schedule, row, _next_tick(schedule, row, now_ms),
            _outcomes(row, alias_for(schedule, conf) if schedule else conf.DATABASE),
            source=source, paused=bool(stored.get(name, (False,))[0]),
            last_message_stored=(name in linkable
                                 and linkable[name].last_offset in stored_offsets),
        ))
    return views


def _still_stored(rows: Iterable[ScheduleRow], alias: str) -> set[int]:
    """Which of the rows' last messages (rows of ``alias``, the database the admin's
    message pages read) are still stored there, in one primary-key read: garbage
    collection may have deleted them."""
    offsets = {row.last_offset for row in rows if row.last_offset is not None}
    if not offsets:
        return set()
    return set(QueueMessage.objects.using(alias).filter(offset__in=offsets)
               .values_list("offset", flat=True))


def current_time_ms() -> int:
    """The queue database's clock (the one schedules tick by)."""
    conf = get_settings()
    connection = connections[conf.DATABASE]
    with connection.cursor() as cursor:
        return storage.store(connection).database_now_ms(cursor)


def _next_tick(schedule: Schedule | None, row: ScheduleRow | None, now_ms: int) -> int | None:
    if schedule is None:
        return None
    tick = schedule.next_tick(max(now_ms, row.checked_until if row else 0))
    due = schedule.due_ticks(row.checked_until, now_ms) if row else []
    return due[0] if due else tick  # a due tick not yet published is "next"


def _outcomes(row: ScheduleRow | None, alias: str) -> dict[str, str]:
    """For each group consuming the last message's topic: done, running, retrying or
    waiting."""
    if row is None or row.last_offset is None:
        return {}
    groups = sorted(g for g, t in known_subscriptions(using=alias) if t == row.last_topic)
    states = {s.consumer_group: s for s in DeliveryState.objects.using(alias).filter(
        topic=row.last_topic, partition_key=row.last_partition_key,
        message_offset=row.last_offset, consumer_group__in=groups)}
    watermarks = dict(PartitionOffset.objects.using(alias).filter(
        topic=row.last_topic, partition_key=row.last_partition_key,
        consumer_group__in=groups).values_list("consumer_group", "offset_acked"))
    outcomes = {}
    for group in groups:
        state = states.get(group)
        if (state is not None and state.acked) or watermarks.get(group, 0) >= row.last_offset:
            outcomes[group] = "done"
        elif state is not None and state.retry_count > 0:
            outcomes[group] = f"retrying ({state.retry_count} failed)"
        elif state is not None:
            outcomes[group] = "running"
        else:
            outcomes[group] = "waiting"
    return outcomes


def run_schedule_now(name: str) -> PublishedTick:
    """Publish one tick of ``name`` now, besides its regular ticks (which it does not
    move): the message carries the current time as its tick."""
    conf = get_settings()
    schedules = {s.name: s for s in configured_schedules(conf)}
    if name not in schedules:
        schedules.update(_stored(name))
    if name not in schedules:
        raise UnknownSchedule(f"No schedule named {name!r} in SQLQUEUE['SCHEDULES'] nor "
                              f"stored (configured: {', '.join(sorted(schedules)) or 'none'}).")
    schedule = schedules[name]
    alias = alias_for(schedule, conf)
    connection = connections[alias]
    store = storage.store(connection)
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        now = store.database_now_ms(cursor)
        store.ensure_schedules(cursor, [(name, now, schedule.definition)])
        published = publish_tick(schedule, now, alias)
        store.record_tick(cursor, name, published)
    return published


def _stored(name: str) -> dict[str, Schedule]:
    """The stored schedule ``name``, paused or not (run now is an operator's own tick),
    checked as the runners check it (its topic allowed, its task a registered one)."""
    from sqlqueue.scheduling.definitions import ScheduleError, parse_schedule
    from sqlqueue.scheduling.stored import usable_schedule

    entry = StoredSchedule.objects.using(get_settings().DATABASE).filter(
        name=name).values_list("entry", flat=True).first()
    if entry is None:
        return {}
    try:
        return {name: usable_schedule(parse_schedule(name, entry), get_settings())}
    except ScheduleError as error:
        raise UnknownSchedule(f"Stored schedule {name!r} is not usable: {error}") from error


def forget_schedule(name: str) -> bool:
    """Delete the row a schedule removed from the settings left behind (its history: last
    tick and message). A configured schedule cannot be forgotten: its row is what makes
    each tick run once. Returns False if there was no such row."""
    conf = get_settings()
    if name in {s.name for s in configured_schedules(conf)}:
        raise UnknownSchedule(f"{name!r} is still in SQLQUEUE['SCHEDULES']: remove it from "
                              "the settings (and deploy) first.")
    if StoredSchedule.objects.using(conf.DATABASE).filter(name=name).exists():
        raise UnknownSchedule(f"{name!r} is a stored schedule: delete it in the admin first.")
    connection = connections[conf.DATABASE]
    with transaction.atomic(using=conf.DATABASE), connection.cursor() as cursor:
        return storage.store(connection).delete_schedule(cursor, name) > 0
