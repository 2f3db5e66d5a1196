"""The Parquet archive: what every group finished, before garbage collection, once."""

from __future__ import annotations

import fcntl
import io
import json
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.conf import get_settings
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.integrations.spark import archive_batches
from sqlqueue.integrations.spark.archive import ARCHIVE_GROUP, ArchiveError, archive
from sqlqueue.integrations.spark.archive_batches import TOPIC_METADATA_KEY
from sqlqueue.integrations.spark.archive_layout import hive_escape, topic_directory
from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage


def publish(topic: str, count: int, partitions: int = 2) -> list[int]:
    sent = send_messages(topic, [OutgoingMessage({"n": n}, partition_key=f"k{n % partitions}",
                                                 id=f"{topic}-{n}") for n in range(count)])
    return [s.offset for s in sent]


def set_watermark(group: str, topic: str, partition: str, offset: int) -> None:
    PartitionOffset.objects.update_or_create(
        consumer_group=group, topic=topic, partition_key=partition,
        defaults={"offset_acked": offset, "updated_at": 1})


def archived_ids(directory: Path, dataset: str = "messages") -> list[str]:
    path = directory / dataset
    if not path.exists():
        return []
    table = ds.dataset(path, format="parquet", partitioning="hive").to_table()
    column = "id" if dataset == "messages" else "message_offset"
    return sorted(str(v) for v in table.column(column).to_pylist())


def collect() -> int:
    from sqlqueue.operations.lag import known_subscriptions

    groups: dict[str, set[str]] = {}
    for group, topic in known_subscriptions():
        groups.setdefault(topic, set()).add(group)
    with connection.cursor() as cursor:
        return GarbageCollector(get_settings(), "default", groups).collect(cursor, force=True)


def test_only_what_every_group_finished_is_archived_and_gc_waits(db_url: str,
                                                                 tmp_path: Path) -> None:
    offsets = publish("orders", 10)  # k0: even n, k1: odd n
    for partition in ("k0", "k1"):
        set_watermark("billing", "orders", partition, offsets[-1])
    set_watermark("emails", "orders", "k0", offsets[3])  # emails finished n <= 3 on k0 ...
    set_watermark("emails", "orders", "k1", offsets[5])  # ... and n <= 5 on k1

    result = archive(tmp_path)  # the first run registers the archive as a group
    assert archived_ids(tmp_path) == sorted(f"orders-{n}" for n in (0, 1, 2, 3, 5))
    assert result.messages == 5
    marks = dict(PartitionOffset.objects.filter(consumer_group=ARCHIVE_GROUP)
                 .values_list("partition_key", "offset_acked"))
    assert marks == {"k0": offsets[3], "k1": offsets[5]}
    # Garbage collection deletes what is archived, nothing more.
    assert collect() == 5

    set_watermark("emails", "orders", "k0", offsets[-1])
    set_watermark("emails", "orders", "k1", offsets[-1])
    assert collect() == 0  # the archive holds the rest back now
    assert archive(tmp_path).messages == 5
    assert archive(tmp_path).messages == 0
    assert archived_ids(tmp_path) == sorted(f"orders-{n}" for n in range(10))
    assert collect() == 5
    assert not QueueMessage.objects.filter(topic="orders").exists()


def test_an_interrupted_run_is_finished_by_the_next(db_url: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    offsets = publish("orders", 30, partitions=3)
    for partition in ("k0", "k1", "k2"):
        set_watermark("billing", "orders", partition, offsets[-1])
    calls = {"apply": 0}
    real_apply = archive_batches.BatchWriter._apply

    def crash_on_second_batch(self: Any, journal: dict[str, Any]) -> None:
        calls["apply"] += 1
        if calls["apply"] == 2:
            raise KeyboardInterrupt("killed after writing the journal")
        real_apply(self, journal)

    monkeypatch.setattr(archive_batches.BatchWriter, "_apply", crash_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        archive(tmp_path, batch_rows=10)
    assert (tmp_path / "_journal.json").exists()
    monkeypatch.undo()

    progress: list[str] = []
    archive(tmp_path, batch_rows=10, on_progress=progress.append)
    assert any("interrupted run" in line for line in progress)
    assert archived_ids(tmp_path) == sorted(f"orders-{n}" for n in range(30))  # each once
    state = json.loads((tmp_path / "_sqlqueue_archive.json").read_text())
    assert state["totals"]["messages"] == 30
    assert not (tmp_path / "_journal.json").exists()
    assert not (tmp_path / "_staging").exists() or not any((tmp_path / "_staging").iterdir())


def test_dead_letters_and_delivery_state_are_archived(db_url: str, tmp_path: Path) -> None:
    offsets = publish("orders", 4, partitions=1)
    set_watermark("billing", "orders", "k0", offsets[-1])
    for offset in offsets:
        DeliveryState.objects.create(consumer_group="billing", topic="orders",
                                     partition_key="k0", message_offset=offset, acked=True,
                                     acked_at=1_767_225_600_000, retry_count=1)
    QueueMessage.objects.create(topic="orders_dlq", partition_key="k0", id="orders-2@billing",
                                payload=b'{"n": 2}', created_at=1_767_225_600_000,
                                published_at=1, consumer_group="billing",
                                original_topic="orders", last_error="ValueError: boom",
                                failure_count=5)
    result = archive(tmp_path)
    assert (result.messages, result.dead_letters, result.deliveries) == (4, 1, 4)
    assert "orders-2@billing" in archived_ids(tmp_path)
    assert (tmp_path / "messages" / "topic=orders_dlq" / "date=2026-01-01").is_dir()
    assert (tmp_path / "deliveries" / "topic=orders" / "date=2026-01-01").is_dir()
    assert archived_ids(tmp_path, "deliveries") == sorted(str(o) for o in offsets)
    assert archive(tmp_path).dead_letters == 0  # its position is kept


def test_one_run_at_a_time(db_url: str, tmp_path: Path) -> None:
    with open(tmp_path / "_lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(ArchiveError, match="another archive run"):
            archive(tmp_path)


def test_the_command(db_url: str, tmp_path: Path) -> None:
    offsets = publish("orders", 3, partitions=1)
    set_watermark("billing", "orders", "k0", offsets[-1])
    out = io.StringIO()
    call_command("queue", "archive", str(tmp_path), "--batch-rows", "2", stdout=out)
    text = out.getvalue()
    assert "batch 1: 2 message(s)" in text and "batch 2: 1 message(s)" in text
    assert "Archived 3 message(s)" in text
    out = io.StringIO()
    call_command("queue", "archive", "--forget", stdout=out)
    assert "on 1 partition(s)" in out.getvalue()
    assert not PartitionOffset.objects.filter(consumer_group=ARCHIVE_GROUP).exists()
    with pytest.raises(CommandError, match="Give the archive directory"):
        call_command("queue", "archive")


def test_spark_reads_the_archive_as_it_reads_the_log(spark: Any, db_url: str,
                                                     tmp_path: Path) -> None:
    topic = 'odd/topic=name:with "chars"'
    offsets = publish(topic, 6)
    for partition in ("k0", "k1"):
        set_watermark("billing", topic, partition, offsets[-1])
    live = (spark.read.format("sqlqueue").option("url", db_url).option("topic", topic).load()
            .orderBy("offset").collect())
    archive(tmp_path)
    assert (tmp_path / "messages" / f"topic={hive_escape(topic)}").is_dir()
    stored = spark.read.parquet(str(tmp_path / "messages"))
    archived = stored.drop("date").select(*live[0].asDict()).orderBy("offset").collect()
    assert archived == live


# -- F2 of the security audit: long topics, and one topic never holds back the others ----------

LONG_TOPICS = ["t" * 251, "q" * 40 + ":" * 200, "ü" * 124 + "é"]


def test_long_topics_get_bounded_directories_and_a_mapping(db_url: str,
                                                            tmp_path: Path) -> None:
    for topic in [*LONG_TOPICS, "orders"]:
        offsets = publish(topic, 3, partitions=1)
        set_watermark("billing", topic, "k0", offsets[-1])

    result = archive(tmp_path)

    assert result.messages == 12 and not result.failed
    names = [p.name for p in (tmp_path / "messages").iterdir()]
    assert "topic=orders" in names
    assert all(len(name.encode()) <= 255 for name in names)
    mapping = json.loads((tmp_path / "_topics.json").read_text())
    assert sorted(mapping.values()) == sorted(LONG_TOPICS)
    for directory, topic in mapping.items():
        assert directory.startswith("topic=") and directory in names
        table = ds.dataset(tmp_path / "messages" / directory, format="parquet").to_table()
        assert sorted(table.column("id").to_pylist()) == [f"{topic}-{n}" for n in range(3)]
    marks = PartitionOffset.objects.filter(consumer_group=ARCHIVE_GROUP)
    assert marks.count() == 4  # every topic's watermark moved
    assert archive(tmp_path).messages == 0


def test_two_topics_never_share_an_archive_directory(db_url: str, tmp_path: Path) -> None:
    """N7: the topic whose full directory name was another's shortened one (the audit's
    ``b``) gets a directory of its own, ``~`` escaped; each file carries its topic."""
    long_topic = "t" * 251
    lookalike = topic_directory(long_topic)[len("topic="):]
    assert topic_directory(lookalike) != topic_directory(long_topic)
    for topic in (long_topic, lookalike):
        offsets = publish(topic, 2, partitions=1)
        set_watermark("billing", topic, "k0", offsets[-1])

    result = archive(tmp_path)

    assert result.messages == 4 and not result.failed
    mapping = json.loads((tmp_path / "_topics.json").read_text())
    # The lookalike, its ~ escaped, is too long too: shortened, with its own hash.
    assert mapping == {topic_directory(t): t for t in (long_topic, lookalike)}
    for topic in (long_topic, lookalike):
        (path,) = (tmp_path / "messages" / topic_directory(topic)).rglob("*.parquet")
        assert pq.read_schema(path).metadata[TOPIC_METADATA_KEY] == topic.encode()
        table = ds.dataset(path, format="parquet").to_table()
        assert sorted(table.column("id").to_pylist()) == [f"{topic}-{n}" for n in range(2)]


def test_a_shortened_directory_another_topic_holds_is_refused(db_url: str,
                                                            tmp_path: Path) -> None:
    """Checked the other way too: a shortened directory ``_topics.json`` gives to another
    topic, or that holds files no entry names, is never written into."""
    long_topic = "t" * 251
    directory = topic_directory(long_topic)
    offsets = publish(long_topic, 2, partitions=1)
    set_watermark("billing", long_topic, "k0", offsets[-1])
    (tmp_path / "_topics.json").write_text(json.dumps({directory: "someone.else"}))
    with pytest.raises(CommandError, match=r"is the archive of topic 'someone\.else'"):
        call_command("queue", "archive", str(tmp_path), stdout=io.StringIO())
    assert not (tmp_path / "messages" / directory).exists()
    (tmp_path / "_topics.json").write_text("{}")
    (tmp_path / "messages" / directory / "date=2026-01-01").mkdir(parents=True)
    with pytest.raises(CommandError, match=r"holds files of a topic _topics\.json does not"):
        call_command("queue", "archive", str(tmp_path), stdout=io.StringIO())


def test_topics_named_alike_but_for_case_never_share_a_folder(db_url: str,
                                                             tmp_path: Path) -> None:
    """Audit W11: ``Orders`` and ``orders`` have directories of their own, which are one
    folder on macOS or Windows: the first archived keeps it, the other is refused (and
    its messages kept for a later run into another directory)."""
    for topic in ("Orders", "orders"):
        offsets = publish(topic, 2, partitions=1)
        set_watermark("billing", topic, "k0", offsets[-1])

    result = archive(tmp_path)

    assert result.messages == 2 and list(result.failed) == ["orders"]
    assert "'topic=orders' is 'topic=Orders', another topic's" in result.failed["orders"]
    assert [p.name for p in (tmp_path / "messages").iterdir()] == ["topic=Orders"]
    marks = dict(PartitionOffset.objects.filter(consumer_group=ARCHIVE_GROUP)
                 .values_list("topic", "offset_acked"))
    assert marks["Orders"] > 0 and marks.get("orders", 0) == 0  # held, not lost
    other = tmp_path / "lower"
    assert archive(other, topics=["orders"]).messages == 2
    assert [p.name for p in (other / "messages").iterdir()] == ["topic=orders"]


def test_a_topic_that_cannot_be_written_does_not_hold_back_the_others(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for topic in ("a.ok", "b.broken", "c.ok"):
        offsets = publish(topic, 3, partitions=1)
        set_watermark("billing", topic, "k0", offsets[-1])
    real_write = archive_batches.pq.write_table

    def fail_for_b(table: Any, where: Any, **kwargs: Any) -> None:
        if "b.broken" in str(where):
            raise OSError(36, "File name too long")
        real_write(table, where, **kwargs)

    monkeypatch.setattr(archive_batches.pq, "write_table", fail_for_b)
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"b\.broken.*File name too long"):
        call_command("queue", "archive", str(tmp_path), stdout=out)
    assert "6 message(s)" in out.getvalue()
    assert archived_ids(tmp_path) == sorted(f"{t}-{n}" for t in ("a.ok", "c.ok")
                                            for n in range(3))
    marks = dict(PartitionOffset.objects.filter(consumer_group=ARCHIVE_GROUP)
                 .values_list("topic", "offset_acked"))
    assert set(marks) >= {"a.ok", "c.ok"} and marks.get("b.broken", 0) == 0
    assert collect() == 6  # garbage collection goes on for the others

    monkeypatch.undo()
    assert archive(tmp_path).messages == 3  # the next run catches up
    assert len(archived_ids(tmp_path)) == 9
