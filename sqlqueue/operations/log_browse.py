"""What the admin's Messages and Dead letters pages read of the log, bounded whatever its
size (issue 52: a log of millions must not cost an operator minutes per page).

Nothing here counts, sorts or de-duplicates the whole log:

* topics come from a loose index scan (``stored_topics``: one statement, one seek per
  topic), groups and subscribed topics from the positions table (``known_subscriptions``);
* the dead letters are read in the dead-letter topics only (``<topic><DLQ_SUFFIX>``), by
  the ``(topic, partition_key, offset)`` index, never by a scan for their columns;
* counts stop at ``COUNT_CAP`` ("more than 10,000");
* a search is a handful of statements of index lookups (``search_offsets``): an offset by
  the primary key, a partition key by ``(topic, partition_key, offset)``, a message id by
  ``(topic, partition_key, id)`` in each partition of each topic; at most ``SEARCH_CAP``
  matches, and as many statements whether there are 3 topics or 3,000;
* a creation-time range becomes a range of offsets first (``created_offset_range``: a
  binary search over the primary key, ``created_at`` following the offsets), so the page
  reads only the offsets of that time.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.models import QueueMessage
from sqlqueue.operations.lag import known_subscriptions
from sqlqueue.operations.unconsumed import stored_topics

#: matches one search returns at most (the newest of each topic first)
SEARCH_CAP = 1_000
#: partitions (of all topics together) a search by message id looks in at most
MAX_SEARCHED_PARTITIONS = 10_000
#: topics the log pages know at most (one statement reads them: about 0.1 s for 10,000
#: on MariaDB); only the first ``LISTED_TOPICS`` of them are offered in a topic filter
MAX_LOG_TOPICS = 100_000
#: how far ``created_at`` may run behind the offsets (concurrent inserts take their
#: offset and their clock at nearly, not exactly, the same time): the offset range of a
#: time range is widened by this much on both sides, and ``created_at`` is still compared
CLOCK_SLACK_MS = 60_000


def browse_topics(using: str) -> list[str]:
    """The log's topics, dead-letter topics included, in order (``MAX_LOG_TOPICS``)."""
    return stored_topics(using, MAX_LOG_TOPICS)


def log_topics(using: str, stored: list[str] | None = None) -> list[str]:
    """Every topic of the log that is not a dead-letter topic, by index seeks (of
    ``stored``, the log's topics if the caller read them already)."""
    suffix = get_settings().DLQ_SUFFIX
    topics = browse_topics(using) if stored is None else stored
    return [t for t in topics if not (suffix and t.endswith(suffix))]


def dead_letter_topics(using: str, stored: list[str] | None = None) -> list[str]:
    """The dead-letter topics that hold rows (``<topic><DLQ_SUFFIX>``), by index seeks
    (of ``stored``, as ``log_topics``)."""
    suffix = get_settings().DLQ_SUFFIX
    topics = browse_topics(using) if stored is None else stored
    return [t for t in topics if suffix and t.endswith(suffix)]


def group_dead_letter_topics(using: str, group: str) -> list[str]:
    """The dead-letter topics that may hold ``group``'s dead letters: those of the topics
    it consumes (``<topic><DLQ_SUFFIX>``), or every one if it consumes none any more. A
    filter by group names these few, not every dead-letter topic: with hundreds of them
    MariaDB estimated its ranges from statistics and read the dead letters of every group
    through another index (0.5-2 s for 100 of 100,000 on a log of 2 million)."""
    suffix = get_settings().DLQ_SUFFIX
    topics = {topic + suffix for g, topic in known_subscriptions(using) if g == group}
    stored = dead_letter_topics(using)
    return [t for t in stored if t in topics] or stored


def subscribed_groups(using: str) -> list[str]:
    """The consumer groups with a position or registered in this process."""
    return sorted({group for group, _ in known_subscriptions(using)})


def subscribed_topics(using: str) -> list[str]:
    """The topics a group has a position on or is registered for in this process."""
    return sorted({topic for _, topic in known_subscriptions(using)})


def partition_keys(using: str, topic: str) -> list[str]:
    """The partition keys of ``topic`` that hold messages (one index seek each)."""
    with connections[using].cursor() as cursor:
        heads = storage.store(using).partition_heads(cursor, topic)
    return sorted(heads)[:MAX_SEARCHED_PARTITIONS]


def search_offsets(term: str, topics: list[str], using: str,
                   cap: int = SEARCH_CAP) -> list[int]:
    """The offsets, newest first, of the messages of ``topics`` that ``term`` names: its
    offset (a number), its partition key, or its message id. Each lookup uses an index;
    three or four statements whatever the number of topics."""
    term = term.strip()
    if not term or not topics:
        return []
    found: set[int] = set()
    rows = QueueMessage.objects.using(using)
    if term.isdigit() and int(term) < 2**63:
        found.update(rows.filter(offset=int(term), topic__in=topics)
                     .values_list("offset", flat=True))
    store = storage.store(using)
    with connections[using].cursor() as cursor:
        found.update(store.newest_of_key(cursor, topics, term, cap))
        if len(topics) == 1:
            partitions = {topics[0]: partition_keys(using, topics[0])}
        else:
            wanted = set(topics)
            partitions = {topic: keys for topic, keys in
                          store.log_partitions(cursor, MAX_SEARCHED_PARTITIONS).items()
                          if topic in wanted}
        partitions = {topic: keys for topic, keys in partitions.items() if keys}
        if partitions:
            found.update(store.offsets_of_id(cursor, partitions, term))
    return sorted(found, reverse=True)[:cap]


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``first`` to ``last`` (inclusive) hold every message created in a time
    range (and others near its ends: ``created_at`` is still compared)."""

    first: int
    last: int


def created_offset_range(using: str, start_ms: int | None,
                         end_ms: int | None) -> OffsetRange | None:
    """The offsets that hold the messages created from ``start_ms`` to ``end_ms`` (either
    open), found by binary search over the primary key (about 2 x 40 seeks), or None when
    the log is empty."""
    rows = QueueMessage.objects.using(using).order_by("offset")
    lowest = rows.values_list("offset", flat=True).first()
    highest = rows.reverse().values_list("offset", flat=True).first()
    if lowest is None or highest is None:
        return None
    first = lowest if start_ms is None else _first_offset_at(
        using, lowest, highest, start_ms - CLOCK_SLACK_MS)
    last = highest if end_ms is None else _first_offset_at(
        using, lowest, highest, end_ms + CLOCK_SLACK_MS)
    return OffsetRange(first, last)


def _first_offset_at(using: str, lowest: int, highest: int, at_ms: int) -> int:
    """The first offset whose row (the first row at or after it) was created at or after
    ``at_ms``; ``highest`` if none."""
    rows = QueueMessage.objects.using(using).order_by("offset").values_list(
        "offset", "created_at")
    low, high = lowest, highest
    while low < high:
        middle = (low + high) // 2
        row = rows.filter(offset__gte=middle).first()
        if row is None or row[1] >= at_ms:
            high = middle
        else:
            low = (row[0] if row[0] > middle else middle) + 1
    return low
