"""``HandlerFailure``: a handler call that raised, as ``run_consumers`` reports it.

Under ``runconsumer`` a handler's exception is an outcome (a retry, then a dead letter),
logged in one line and stored as text. A test needs more: the exception itself, to assert
on it or to see where it came from. ``run_consumers`` keeps each one
(``RunReport.errors``), or raises the first (``raise_errors=True``).
"""

from __future__ import annotations

import dataclasses
import traceback as tracebacks
from dataclasses import dataclass

from sqlqueue.consuming import handlers
from sqlqueue.consuming.handlers import Outcome
from sqlqueue.consuming.message import Message

#: the longest exception repr a ``HandlerFailure``'s repr shows (a report's repr is what
#: a failed ``assertEqual`` prints: the traceback is in ``traceback``)
REPR_CHARS = 200


@dataclass(frozen=True, repr=False)
class HandlerFailure:
    """A handler call that raised an exception other than ``Retry`` and ``Reject`` (the
    handler's own answers, counted in ``retried`` and ``dead_lettered``)."""

    #: the message as the handler received it (one whose metadata, written by another
    #: program, is not JSON never reached the handler: ``exception`` says so, and here
    #: its metadata is empty)
    message: Message
    exception: BaseException
    #: ``exception`` formatted with its traceback, as Python prints it
    traceback: str

    @classmethod
    def of(cls, outcome: Outcome) -> HandlerFailure:
        """The failure a "fail" outcome with its exception records."""
        assert outcome.exception is not None
        delivery = outcome.delivery
        try:
            message = handlers.build_message(delivery, extend=False)
        except (ValueError, RecursionError):  # the metadata is not JSON (or too deep)
            without = dataclasses.replace(delivery.row, metadata=None)
            message = handlers.build_message(dataclasses.replace(delivery, row=without),
                                             extend=False)
        return cls(message, outcome.exception, formatted(outcome.exception))

    @property
    def where(self) -> str:
        """Which message and delivery: ``topic/key@offset for 'group', attempt n``."""
        message = self.message
        return (f"{message.topic}/{message.partition_key}@{message.offset} for "
                f"{message.consumer_group!r}, attempt {message.attempt}")

    def __repr__(self) -> str:
        try:
            raised = repr(self.exception)
        except Exception:
            raised = f"<{type(self.exception).__qualname__} whose repr() failed>"
        if len(raised) > REPR_CHARS:
            raised = raised[:REPR_CHARS] + "..."
        return f"HandlerFailure({self.where}: {raised})"


def formatted(exception: BaseException) -> str:
    """The exception and its traceback as Python prints them; never raises (an exception
    chain too deep to format is named by its type)."""
    try:
        return "".join(tracebacks.format_exception(exception))
    except Exception:
        kind = type(exception)
        return f"{kind.__module__}.{kind.__qualname__}: <the exception could not be formatted>"
