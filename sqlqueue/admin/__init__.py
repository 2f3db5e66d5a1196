"""The Django admin for operators: the message log, dead letters, the lag dashboard and
subscribers (read-only data; every action calls the service functions in
``sqlqueue.operations``)."""

from sqlqueue.admin import (
    activity,
    dead_letters,
    lag,
    messages,
    schedules,
    stored_schedules,
    subscribers,
)

__all__ = ["activity", "dead_letters", "lag", "messages", "schedules", "stored_schedules",
           "subscribers"]
