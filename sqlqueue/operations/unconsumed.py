"""Topics that have messages and no consumer group (docs/guides/operator-commands.md,
``queue status``).

Nobody consumes such a topic yet: its messages are kept (garbage collection only
collects what the known groups finished) and a group added later starts where its
``@consumer(start=...)`` says. The admin's lag overview, ``queue status`` and
``queue health`` (a warning, still healthy) show them, so that a typo in a topic name or a
consumer left out of ``INSTALLED_APPS`` is not silent.

The topics are found by a loose index scan, one statement (``log_topics``): one seek of
``idx_topic_partition_offset`` per topic, so the cost grows with the number of topics,
not of messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.operations import COUNT_CAP
from sqlqueue.operations.lag import known_subscriptions

#: topics looked at, at most (a page or a command stays fast whatever is stored)
MAX_TOPICS = 1_000


@dataclass(frozen=True)
class UnconsumedTopic:
    topic: str
    messages: int
    capped: bool  # ``messages`` is a lower bound

    def describe(self) -> str:
        count = f"{'at least ' if self.capped else ''}{self.messages}"
        return (f"topic {self.topic!r} has {count} message(s) and no consumer group "
                f"(kept until a group consumes it)")


def stored_topics(using: str, limit: int = MAX_TOPICS) -> list[str]:
    """The distinct topics of ``queue_messages`` in order, at most ``limit``, by one
    statement (a loose index scan: one seek each)."""
    with connections[using].cursor() as cursor:
        return storage.store(using).log_topics(cursor, limit)


def unconsumed_topics(using: str | None = None) -> list[UnconsumedTopic]:
    """Topics with messages that no consumer group has a position on or is registered
    for in this process; dead-letter topics (``DLQ_SUFFIX``) left out."""
    conf = get_settings()
    alias = using or conf.DATABASE
    consumed = {topic for _, topic in known_subscriptions(alias)}
    unconsumed = [topic for topic in stored_topics(alias)
                  if topic not in consumed
                  and not (conf.DLQ_SUFFIX and topic.endswith(conf.DLQ_SUFFIX))]
    if not unconsumed:
        return []
    # One statement per 200 topics (a capped count each), not one per topic: 1,000
    # topics nobody consumes took 3 s of the lag overview on MariaDB (issue 52).
    with connections[alias].cursor() as cursor:
        counts = storage.store(alias).topic_counts(cursor, unconsumed, COUNT_CAP + 1)
    return [UnconsumedTopic(topic, min(counts.get(topic, 0), COUNT_CAP),
                            counts.get(topic, 0) > COUNT_CAP) for topic in unconsumed]
