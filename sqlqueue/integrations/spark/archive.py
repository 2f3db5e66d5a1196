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

Resumable: each batch is written to ``_staging/``, then a journal names its files and the
positions it reaches, then the files move into place and the positions are recorded. A
run that was interrupted finishes the journal it finds before doing anything else, so
every message lands in the archive exactly once.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sqlqueue.exceptions import SqlqueueError
from sqlqueue.integrations.spark.archive_layout import (
    JOURNAL_FILE,
    LOCK_FILE,
    STAGING,
    STATE_FILE,
    DirectoryTaken,
    record_topic_directories,
    topic_directory,
    write_json,
)
from sqlqueue.integrations.spark.arrow import record_batch
from sqlqueue.integrations.spark.connect import Connection, Database
from sqlqueue.integrations.spark.horizon import database_now_ms, settled_before_ms
from sqlqueue.integrations.spark.tables import TABLES, Column

ARCHIVE_GROUP = "sqlqueue:archive"
READ_CHUNK = 10_000
MESSAGE_COLUMNS = TABLES["messages"].columns
STATE_COLUMNS = TABLES["delivery_state"].columns
MESSAGE_NAMES = [c.name for c in MESSAGE_COLUMNS]
CREATED_AT = MESSAGE_NAMES.index("created_at")
ACKED_AT = [c.name for c in STATE_COLUMNS].index("acked_at")


#: the Parquet files' key-value metadata entry holding their topic
TOPIC_METADATA_KEY = b"sqlqueue.topic"


class ArchiveError(SqlqueueError):
    """The archive cannot run (another run holds its lock, or pyarrow is missing)."""


class _TopicFailed(Exception):
    """A topic's batch could not be written; nothing of it was recorded."""


@dataclass
class ArchiveResult:
    messages: int = 0
    dead_letters: int = 0
    deliveries: int = 0
    files: int = 0
    batches: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # topic -> why it was skipped

    def describe(self) -> str:
        text = (f"Archived {self.messages} message(s), {self.dead_letters} dead letter(s) "
                f"and {self.deliveries} delivery state row(s) in {self.files} file(s).")
        if self.failed:
            text += f" {len(self.failed)} topic(s) failed and were skipped."
        return text


@dataclass
class _Piece:
    """Rows of one partition to archive, and the position the archive reaches with them."""

    topic: str
    partition: str
    rows: list[tuple[Any, ...]]
    reaches: int
    dead_letters: bool = False
    states: list[tuple[Any, ...]] = field(default_factory=list)


class Archiver:
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
        self.result = ArchiveResult()

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> ArchiveResult:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / LOCK_FILE, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ArchiveError(f"another archive run is writing to {self.directory}") from None
            self._recover()
            with self.database.connect() as db:
                self._archive(db)
        return self.result

    def _archive(self, db: Connection) -> None:
        subscriptions = self._subscriptions()
        before = settled_before_ms(db, database_now_ms(db),
                                   round(self.conf.MAX_TRANSACTION_AGE * 1000))
        for topic in sorted(subscriptions):
            try:
                self._archive_topic(db, topic, subscriptions[topic], before)
            except _TopicFailed as exc:
                self.result.failed[topic] = str(exc.__cause__ or exc)
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
        pending: list[_Piece] = []
        count = 0
        for piece in self._pieces(db, topic, groups, before):
            pending.append(piece)
            count += len(piece.rows)
            if count >= self.batch_rows:
                self._flush(db, pending)
                pending, count = [], 0
        if pending:
            self._flush(db, pending)

    def _subscriptions(self) -> dict[str, set[str]]:
        """topic -> the groups (other than the archive) that must finish a message first."""
        from sqlqueue.operations.lag import known_subscriptions

        groups: dict[str, set[str]] = defaultdict(set)
        for group, topic in known_subscriptions(self.alias):
            if group != self.group and (not self.topics or topic in self.topics):
                groups[topic].add(group)
        return groups

    def _pieces(self, db: Connection, topic: str, groups: set[str],
                before: int | None) -> Iterator[_Piece]:
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
                   finished: int, groups: set[str]) -> Iterator[_Piece]:
        """Rows of (archived, finished], in pieces of at most a batch."""
        after = archived
        while after < finished:
            rows = db.rows(db.sql.partition_rows(MESSAGE_NAMES, topic, partition, after,
                                                 finished, self.batch_rows))
            reaches = finished if len(rows) < self.batch_rows else int(rows[-1][0])
            states = [state for group in sorted(groups) for state in db.rows(
                db.sql.partition_states(STATE_COLUMNS, group, topic, partition, after, reaches))]
            yield _Piece(topic, partition, rows, reaches, states=states)
            after = reaches

    def _dead_letters(self, db: Connection, topic: str, before: int | None
                      ) -> Iterator[_Piece]:
        """Dead letters that are settled (no transaction that could still commit one below
        them was open at ``before``), from where the state file says the archive stopped."""
        positions = self._state().get("dead_letters", {})
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
                    yield _Piece(topic, partition, settled, after, dead_letters=True)
                if len(settled) < self.batch_rows:
                    break

    # -- writing a batch -----------------------------------------------------------------------
    def _flush(self, db: Connection, pieces: list[_Piece]) -> None:
        batch = f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        staging = self.directory / STAGING / batch
        try:
            record_topic_directories(self.directory, {p.topic for p in pieces})
            files = self._write(staging, batch, "messages", MESSAGE_COLUMNS,
                                [r for p in pieces for r in p.rows], date_column=CREATED_AT)
            files += self._write(staging, batch, "deliveries", STATE_COLUMNS,
                                 [s for p in pieces for s in p.states], date_column=ACKED_AT)
        except (OSError, DirectoryTaken) as exc:  # before the journal: nothing of it counts
            shutil.rmtree(staging, ignore_errors=True)
            raise _TopicFailed(str(exc)) from exc
        journal = {
            "batch": batch,
            "files": files,
            "watermarks": [[p.topic, p.partition, p.reaches] for p in pieces
                           if not p.dead_letters],
            "dead_letters": [[p.topic, p.partition, p.reaches] for p in pieces
                             if p.dead_letters],
            "messages": sum(len(p.rows) for p in pieces if not p.dead_letters),
            "dead_letter_rows": sum(len(p.rows) for p in pieces if p.dead_letters),
            "deliveries": sum(len(p.states) for p in pieces),
        }
        write_json(self.directory / JOURNAL_FILE, journal)
        self._apply(journal)
        topics = sorted({p.topic for p in pieces})
        self.progress(f"batch {self.result.batches}: {journal['messages']} message(s), "
                      f"{journal['dead_letter_rows']} dead letter(s), {len(files)} file(s) "
                      f"({', '.join(topics[:3])}{', ...' if len(topics) > 3 else ''}); "
                      f"{self.result.messages + self.result.dead_letters} archived so far")

    def _write(self, staging: Path, batch: str, dataset: str, columns: tuple[Column, ...],
               rows: list[tuple[Any, ...]], date_column: int) -> list[list[str]]:
        """One Parquet file per (topic, date) of ``rows``; returns [staging, final] paths
        relative to the archive directory."""
        groups: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
        topic_index = [c.name for c in columns].index("topic")
        for row in rows:
            when = datetime.fromtimestamp(int(row[date_column]) / 1000, tz=UTC)
            groups[(row[topic_index], when.date().isoformat())].append(row)
        files = []
        for (topic, day), chunk in sorted(groups.items()):
            table = pa.Table.from_batches([record_batch(chunk, columns)]).drop_columns(["topic"])
            # The directory names the topic for Spark's reader; the file names it too, so
            # that a file read on its own (or moved) still says whose it is.
            table = table.replace_schema_metadata(
                {**(table.schema.metadata or {}), TOPIC_METADATA_KEY: topic.encode("utf-8")})
            relative = Path(dataset) / topic_directory(topic) / f"date={day}"
            name = f"part-{batch}.parquet"
            (staging / relative).mkdir(parents=True, exist_ok=True)
            pq.write_table(table, staging / relative / name, compression="zstd")
            files.append([str((staging / relative / name).relative_to(self.directory)),
                          str(relative / name)])
        return files

    def _apply(self, journal: dict[str, Any]) -> None:
        """Move the batch's files into place, then record the positions it reached."""
        from django.db import connections, transaction

        from sqlqueue import storage

        for staged, final in journal["files"]:
            source, target = self.directory / staged, self.directory / final
            if source.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
        connection = connections[self.alias]
        store = storage.store(connection)
        with transaction.atomic(using=self.alias), connection.cursor() as cursor:
            for topic, partition, reaches in journal["watermarks"]:
                store.ensure_watermark(cursor, self.group, topic, partition)
                store.advance_watermarks(cursor, self.group, topic,
                                           [(partition, int(reaches), None)])
        state = self._state()
        if state.get("last_batch") != journal["batch"]:
            positions = state.setdefault("dead_letters", {})
            for topic, partition, reaches in journal["dead_letters"]:
                slot = positions.setdefault(topic, {})
                slot[partition] = max(int(slot.get(partition, 0)), int(reaches))
            totals = state.setdefault("totals", {})
            for key in ("messages", "dead_letter_rows", "deliveries"):
                totals[key] = int(totals.get(key, 0)) + int(journal[key])
            state["last_batch"] = journal["batch"]
            state["updated_at"] = datetime.now(UTC).isoformat()
            write_json(self.directory / STATE_FILE, state)
        (self.directory / JOURNAL_FILE).unlink(missing_ok=True)
        shutil.rmtree(self.directory / STAGING / journal["batch"], ignore_errors=True)
        self.result.messages += int(journal["messages"])
        self.result.dead_letters += int(journal["dead_letter_rows"])
        self.result.deliveries += int(journal["deliveries"])
        self.result.files += len(journal["files"])
        self.result.batches += 1

    def _recover(self) -> None:
        """Finish the batch an interrupted run left (its journal), and drop staged files
        no journal names (written before the crash, exported again now)."""
        journal_path = self.directory / JOURNAL_FILE
        if journal_path.exists():
            journal = json.loads(journal_path.read_text())
            self.progress(f"finishing batch {journal['batch']} of an interrupted run")
            self._apply(journal)
        shutil.rmtree(self.directory / STAGING, ignore_errors=True)

    def _state(self) -> dict[str, Any]:
        path = self.directory / STATE_FILE
        return json.loads(path.read_text()) if path.exists() else {}


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

