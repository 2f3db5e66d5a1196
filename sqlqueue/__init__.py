"""sqlqueue: a durable, partitioned message queue in your Django project's database.

Public API (see docs/reference/api.md)::

    from sqlqueue import send_message, send_messages, OutgoingMessage
    from sqlqueue import consumer, Message, Retry, Reject

Importing this package never touches Django settings or the database, so it is safe to
import from models, settings-free scripts and ``AppConfig`` modules.
"""

from __future__ import annotations

from sqlqueue.consuming.message import Message, Reject, Retry
from sqlqueue.consuming.registry import consumer
from sqlqueue.exceptions import ConfigurationError, InvalidMessage, SqlqueueError
from sqlqueue.publishing.api import send_message, send_messages
from sqlqueue.publishing.messages import DEFAULT_PRIORITY, OutgoingMessage, SentMessage

__version__ = "0.1.0.dev0"

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
    "consumer",
    "send_message",
    "send_messages",
]
