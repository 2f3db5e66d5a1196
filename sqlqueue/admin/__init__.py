"""The Django admin for operators: the message log and dead letters (read-only data;
every action calls the service functions in ``sqlqueue.operations``)."""

from sqlqueue.admin import dead_letters, messages

__all__ = ["dead_letters", "messages"]
