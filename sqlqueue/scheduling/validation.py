"""What ``manage.py check`` finds wrong with ``SQLQUEUE["SCHEDULES"]``: the entries'
shape (``definitions``), and what needs the project to judge: a topic name sqlqueue can
store, a payload it can publish, a task that exists and runs on sqlqueue's backend."""

from __future__ import annotations

from sqlqueue.conf import QueueSettings
from sqlqueue.publishing.messages import OutgoingMessage, check_topic, prepare
from sqlqueue.scheduling.definitions import Schedule, ScheduleError, parse_schedules
from sqlqueue.scheduling.targets import target_for
from sqlqueue.scheduling.ticker import tick_metadata


def schedule_errors(conf: QueueSettings) -> list[ScheduleError]:
    """Every problem of every schedule, each with its check id."""
    schedules, errors = parse_schedules(dict(conf.SCHEDULES))
    for schedule in schedules:
        try:
            check_schedule(schedule, conf)
        except ScheduleError as error:
            errors.append(error)
    return errors


def check_schedule(schedule: Schedule, conf: QueueSettings) -> None:
    """What needs the project to judge of one parsed schedule; raises ``ScheduleError``."""
    if schedule.topic is not None:
        _check_message(schedule, conf)
    else:
        target_for(schedule).check(schedule)


def _where(schedule: Schedule) -> str:
    return f"SQLQUEUE['SCHEDULES'][{schedule.name!r}]"


def _check_message(schedule: Schedule, conf: QueueSettings) -> None:
    assert schedule.topic is not None
    try:
        topic = check_topic(schedule.topic, conf)
    except (TypeError, ValueError) as exc:
        raise ScheduleError("sqlqueue.E307", f"{_where(schedule)}['topic']: {exc}",
                            "topic") from exc
    tick = schedule.next_tick(0)
    message = OutgoingMessage(
        schedule.payload, schedule.partition_key, schedule.message_id(tick),
        {**schedule.metadata, **tick_metadata(schedule, tick)}, schedule.priority,
    )
    try:
        prepare(topic, message, conf, 0)  # what send_message would refuse
    except (TypeError, ValueError) as exc:
        raise ScheduleError("sqlqueue.E309", f"{_where(schedule)}: its message cannot be "
                                             f"published: {exc}", _field_of(exc)) from exc


#: the message fields a refusal may name first (``InvalidMessage``'s words)
_MESSAGE_FIELDS = ("payload", "partition_key", "priority", "metadata")


def _field_of(error: Exception) -> str | None:
    """The schedule's key a refused message's error is about, for the form."""
    text = str(error)
    return next((key for key in _MESSAGE_FIELDS if text.startswith(key)), None)
