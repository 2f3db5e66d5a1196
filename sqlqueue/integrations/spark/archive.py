"""The archive: finished messages exported to Parquet before garbage collection deletes
them (``manage.py queue archive DIR``; docs/guides/spark.md).

The archive is a consumer group of its own, ``sqlqueue:archive``, that never runs a
handler: its watermark on a partition says how far that partition is archived. A message
is archived once every other known group of its topic has finished it (their lowest
watermark), and the archive's watermark then moves past it. Because the archive is a known
group, garbage collection deletes nothing the archive has not exported; stop archiving
with ``--forget``, which deletes its watermarks. Topics no group consumes are never
collected, hence never archived. Dead letters (never collected either) are archived as
they settle, with their position kept in the archive's state file.

Layout (Hive-style partitions, readable by ``spark.read.parquet``)::

    DIR/messages/topic=<topic>/date=<YYYY-MM-DD>/part-<batch>.parquet   the log's columns
    DIR/deliveries/topic=<topic>/date=<YYYY-MM-DD>/part-<batch>.parquet  delivery state
    DIR/_sqlqueue_archive.json                                          state and totals
    DIR/_topics.json                          shortened topic directories -> their topic

A directory name never exceeds 255 bytes (NAME_MAX): ``topic=<topic>`` that would is cut
and ends in ``~`` and 16 hex digits of the topic's SHA-256, and ``_topics.json`` maps it
back to the topic (a ``~`` of a topic is escaped, so no two topics share a directory; each
Parquet file names its topic in its key-value metadata too). Topics are archived one
after the other, each in batches of its own; a topic whose files cannot be written is
reported and skipped, and the others go on.

``date`` is the UTC day the message was stored (deliveries: the day of the ack). Delivery
state is there when the project keeps it (SQLQUEUE['KEEP_DELIVERY_STATE']).

Resumable (``archive_batches``): each batch is written to ``_staging/``, then a journal
names its files and the positions it reaches, then the files move into place and the
positions are recorded. A run that was interrupted finishes the journal it finds before
doing anything else, so every message lands in the archive exactly once. This module
chooses what goes into the batches.
"""

from __future__ import annotations

import fcntl
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from sqlqueue.exceptions import SqlqueueError
from sqlqueue.integrations.spark.archive_batches import (
    CREATED_AT,
    MESSAGE_NAMES,
    STATE_COLUMNS,
    ArchiveResult,
    BatchNotWritten,
    BatchWriter,
    Piece,
)
from sqlqueue.integrations.spark.archive_layout import LOCK_FILE
from sqlqueue.integrations.spark.connect import Connection, Database
from sqlqueue.integrations.spark.horizon import database_now_ms, settled_before_ms

ARCHIVE_GROUP = "sqlqueue:archive"
READ_CHUNK = 10_000


class ArchiveError(SqlqueueError):
    """The archive cannot run (another run holds its lock, or pyarrow is missing)."""


class Archiver:
    """One archive run: which rows each topic's groups have finished (and which dead letters
    are settled), handed to its ``BatchWriter`` in batches of ``batch_rows``."""

    def __init__(self, directory: Path, database: Database, *, group: str = ARCHIVE_GROUP,
                 topics: Sequence[str] | None = None, batch_rows: int = 100_000,
                 on_progress: Callable[[str], None] | None = None,
                 using: str | None = None) -> None:
        from sqlqueue.conf import get_settings

        self.directory = directory
        self.database = database
        self.group = group
        self.topics = list(topics or [])
        self.batch_rows = batch_rows
        self.progress = on_progress or (lambda text: None)
        self.conf = get_settings()
        self.alias = using or self.conf.DATABASE
        self.failed: dict[str, str] = {}  # topic -> why it was skipped
        self.batches = BatchWriter(directory, alias=self.alias, group=group,
                                   progress=self.progress)

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> ArchiveResult:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / LOCK_FILE, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ArchiveError(f"another archive run is writing to {self.directory}") from None
            self.batches.recover()
            with self.database.connect() as db:
                self._archive(db)
        return replace(self.batches.written, failed=dict(self.failed))

    def _archive(self, db: Connection) -> None:
        subscriptions = self._subscriptions()
        before = settled_before_ms(db, database_now_ms(db),
                                   round(self.conf.MAX_TRANSACTION_AGE * 1000))
        for topic in sorted(subscriptions):
            try:
                self._archive_topic(db, topic, subscriptions[topic], before)
            except BatchNotWritten as exc:
                self.failed[topic] = str(exc.__cause__ or exc)
                self.progress(f"topic {topic[:80]!r} skipped: {exc.__cause__ or exc}")
                self._hold(topic)

    def _hold(self, topic: str) -> None:
        """Register the archive on every partition of a topic it skipped, so that garbage
        collection keeps the topic's messages until a later run exports them."""
        from django.db import connections, transaction

        from sqlqueue import storage

        connection = connections[self.alias]
        store = storage.store(connection)
        with transaction.atomic(using=self.alias), connection.cursor() as cursor:
            _, watermarks = store.topic_watermarks(cursor, topic)
            for partition in watermarks:
                store.ensure_watermark(cursor, self.group, topic, partition)

    def _archive_topic(self, db: Connection, topic: str, groups: set[str],
                       before: int | None) -> None:
        """The topic's finished messages, then its settled dead letters, in batches."""
        pending: list[Piece] = []
        count = 0
        for piece in self._pieces(db, topic, groups, before):
            pending.append(piece)
            count += len(piece.rows)
            if count >= self.batch_rows:
                self.batches.flush(pending)
                pending, count = [], 0
        if pending:
            self.batches.flush(pending)

    def _subscriptions(self) -> dict[str, set[str]]:
        """topic -> the groups (other than the archive) that must finish a message first."""
        from sqlqueue.operations.lag import known_subscriptions

        groups: dict[str, set[str]] = defaultdict(set)
        for group, topic in known_subscriptions(self.alias):
            if group != self.group and (not self.topics or topic in self.topics):
                groups[topic].add(group)
        return groups

    def _pieces(self, db: Connection, topic: str, groups: set[str],
                before: int | None) -> Iterator[Piece]:
        from django.db import connections

        from sqlqueue import storage

        connection = connections[self.alias]
        with connection.cursor() as cursor:
            _, watermarks = storage.store(connection).topic_watermarks(cursor, topic)
        for partition in sorted(watermarks):
            marks = watermarks[partition]
            finished = min(marks.get(group, 0) for group in groups)
            yield from self._partition(db, topic, partition, marks.get(self.group, 0),
                                       finished, groups)
        yield from self._dead_letters(db, topic + self.conf.DLQ_SUFFIX, before)

    def _partition(self, db: Connection, topic: str, partition: str, archived: int,
                   finished: int, groups: set[str]) -> Iterator[Piece]:
        """Rows of (archived, finished], in pieces of at most a batch."""
        after = archived
        while after < finished:
            rows = db.rows(db.sql.partition_rows(MESSAGE_NAMES, topic, partition, after,
                                                 finished, self.batch_rows))
            reaches = finished if len(rows) < self.batch_rows else int(rows[-1][0])
            states = [state for group in sorted(groups) for state in db.rows(
                db.sql.partition_states(STATE_COLUMNS, group, topic, partition, after, reaches))]
            yield Piece(topic, partition, rows, reaches, states=states)
            after = reaches

    def _dead_letters(self, db: Connection, topic: str, before: int | None
                      ) -> Iterator[Piece]:
        """Dead letters that are settled (no transaction that could still commit one below
        them was open at ``before``), from where the state file says the archive stopped."""
        positions = self.batches.dead_letter_positions()
        for (partition,) in db.rows(db.sql.discover_partitions(topic)):
            after = int(positions.get(topic, {}).get(partition, 0))
            while True:
                rows = db.rows(db.sql.partition_rows(MESSAGE_NAMES, topic, partition,
                                                     after, 1 << 62, self.batch_rows))
                settled = []
                for row in rows:
                    if before is not None and int(row[CREATED_AT]) >= before:
                        break
                    settled.append(row)
                if settled:
                    after = int(settled[-1][0])
                    yield Piece(topic, partition, settled, after, dead_letters=True)
                if len(settled) < self.batch_rows:
                    break



def archive(directory: str | Path, *, topics: Sequence[str] | None = None,
            batch_rows: int = 100_000, group: str = ARCHIVE_GROUP,
            on_progress: Callable[[str], None] | None = None,
            using: str | None = None) -> ArchiveResult:
    """Export what every group has finished (and settled dead letters) to Parquet under
    ``directory``; resumable, one run at a time. Returns what was archived."""
    from sqlqueue.integrations.spark.settings import database_url

    database = Database.from_url(database_url(using))
    return Archiver(Path(directory), database, group=group, topics=topics,
                    batch_rows=batch_rows, on_progress=on_progress, using=using).run()


def forget(group: str = ARCHIVE_GROUP, using: str | None = None) -> int:
    """Stop holding garbage collection back for the archive: delete its watermarks."""
    from sqlqueue.conf import get_settings
    from sqlqueue.models import PartitionOffset

    alias = using or get_settings().DATABASE
    deleted, _ = PartitionOffset.objects.using(alias).filter(consumer_group=group).delete()
    return deleted

