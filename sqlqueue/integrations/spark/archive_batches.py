"""A batch of the archive (sqlqueue.integrations.spark.archive), written so that every
message lands in it exactly once: Parquet files to ``_staging/``, then a journal naming
them and the positions they reach, then the files moved into place and the positions
recorded (the archive's watermarks; the dead letters' in its state file). A run that was
interrupted finishes the journal it finds before doing anything else (``recover``).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sqlqueue.exceptions import SqlqueueError
from sqlqueue.integrations.spark.archive_layout import (
    JOURNAL_FILE,
    STAGING,
    STATE_FILE,
    DirectoryTaken,
    record_topic_directories,
    topic_directory,
    write_json,
)
from sqlqueue.integrations.spark.arrow import record_batch
from sqlqueue.integrations.spark.tables import MESSAGE_COLUMNS, TABLES, Column

STATE_COLUMNS = TABLES["delivery_state"].columns
MESSAGE_NAMES = [c.name for c in MESSAGE_COLUMNS]
CREATED_AT = MESSAGE_NAMES.index("created_at")
ACKED_AT = [c.name for c in STATE_COLUMNS].index("acked_at")
#: the Parquet files' key-value metadata entry holding their topic
TOPIC_METADATA_KEY = b"sqlqueue.topic"


class BatchNotWritten(SqlqueueError):
    """A topic's batch could not be written; nothing of it was recorded (the archive
    reports the topic and goes on with the others)."""


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
class Piece:
    """Rows of one partition to archive, and the position the archive reaches with them."""

    topic: str
    partition: str
    rows: list[tuple[Any, ...]]
    reaches: int
    dead_letters: bool = False
    states: list[tuple[Any, ...]] = field(default_factory=list)


class BatchWriter:
    """Writes the archive's batches under ``directory`` and records the positions they
    reach for ``group`` on the database ``alias``; counts what it wrote in ``written``."""

    def __init__(self, directory: Path, *, alias: str, group: str,
                 progress: Callable[[str], None]) -> None:
        self.directory = directory
        self.alias = alias
        self.group = group
        self.progress = progress
        self.written = ArchiveResult()

    def flush(self, pieces: list[Piece]) -> None:
        """Write ``pieces`` as one batch, and record the positions they reach."""
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
            raise BatchNotWritten(str(exc)) from exc
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
        self.progress(f"batch {self.written.batches}: {journal['messages']} message(s), "
                      f"{journal['dead_letter_rows']} dead letter(s), {len(files)} file(s) "
                      f"({', '.join(topics[:3])}{', ...' if len(topics) > 3 else ''}); "
                      f"{self.written.messages + self.written.dead_letters} archived so far")

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
        self.written.messages += int(journal["messages"])
        self.written.dead_letters += int(journal["dead_letter_rows"])
        self.written.deliveries += int(journal["deliveries"])
        self.written.files += len(journal["files"])
        self.written.batches += 1

    def recover(self) -> None:
        """Finish the batch an interrupted run left (its journal), and drop staged files
        no journal names (written before the crash, exported again now)."""
        journal_path = self.directory / JOURNAL_FILE
        if journal_path.exists():
            journal = json.loads(journal_path.read_text())
            self.progress(f"finishing batch {journal['batch']} of an interrupted run")
            self._apply(journal)
        shutil.rmtree(self.directory / STAGING, ignore_errors=True)

    def dead_letter_positions(self) -> dict[str, dict[str, int]]:
        """topic -> partition -> the dead letters' offset the archive has reached."""
        positions: dict[str, dict[str, int]] = self._state().get("dead_letters", {})
        return positions

    def _state(self) -> dict[str, Any]:
        path = self.directory / STATE_FILE
        return json.loads(path.read_text()) if path.exists() else {}
