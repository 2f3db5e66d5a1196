"""sqlqueue: a durable, partitioned message queue in your Django project's database.

Public API (see docs/reference/api.md)::

    from sqlqueue import send_message, send_messages, OutgoingMessage
    from sqlqueue import consumer, batch_consumer, Message, Retry, Reject

Importing this package never touches Django settings or the database, so it is safe to
import from models, settings-free scripts and ``AppConfig`` modules. The public names are
loaded on first use: Spark executors import ``sqlqueue.integrations.spark`` without
importing Django at all (docs/guides/spark.md).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlqueue.consuming.message import Message, Reject, Retry
    from sqlqueue.consuming.registry import batch_consumer, consumer
    from sqlqueue.exceptions import ConfigurationError, InvalidMessage, SqlqueueError
    from sqlqueue.publishing.api import send_message, send_messages
    from sqlqueue.publishing.messages import DEFAULT_PRIORITY, OutgoingMessage, SentMessage

__version__ = "0.2.0"

_EXPORTS = {
    "DEFAULT_PRIORITY": "sqlqueue.publishing.messages",
    "ConfigurationError": "sqlqueue.exceptions",
    "InvalidMessage": "sqlqueue.exceptions",
    "Message": "sqlqueue.consuming.message",
    "OutgoingMessage": "sqlqueue.publishing.messages",
    "Reject": "sqlqueue.consuming.message",
    "Retry": "sqlqueue.consuming.message",
    "SentMessage": "sqlqueue.publishing.messages",
    "SqlqueueError": "sqlqueue.exceptions",
    "batch_consumer": "sqlqueue.consuming.registry",
    "consumer": "sqlqueue.consuming.registry",
    "send_message": "sqlqueue.publishing.api",
    "send_messages": "sqlqueue.publishing.api",
}

__all__ = [
    "DEFAULT_PRIORITY",
    "ConfigurationError",
    "InvalidMessage",
    "Message",
    "OutgoingMessage",
    "Reject",
    "Retry",
    "SentMessage",
    "SqlqueueError",
    "batch_consumer",
    "consumer",
    "send_message",
    "send_messages",
]
assert sorted(__all__) == sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sqlqueue' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
