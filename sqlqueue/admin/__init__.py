"""The Django admin for operators: the message log, dead letters, the lag dashboard and
subscribers (read-only data; every action calls the service functions in
``sqlqueue.operations``)."""

from sqlqueue.admin import (
    dead_letters,
    lag,
    messages,
    schedules,
    stored_schedules,
    subscribers,
)

__all__ = ["dead_letters", "lag", "messages", "schedules", "stored_schedules", "subscribers"]
