"""Archive folders that one filesystem tells apart and another does not (issue 53, audit
W11): ``topic=Orders`` and ``topic=orders``, or a composed and a decomposed ``café``, are
one folder on macOS or Windows. The archive never lets a second topic into a folder
another one's name folds to (sqlqueue.integrations.spark.archive_layout; no Spark, no
database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sqlqueue.integrations.spark.archive_layout import (
    DirectoryTaken,
    folded,
    record_topic_directories,
    topic_directory,
)


def archived(directory: Path, topic: str, dataset: str = "messages") -> None:
    (directory / dataset / topic_directory(topic) / "date=2026-01-01").mkdir(parents=True)


@pytest.mark.parametrize(("first", "second"), [
    ("Orders", "orders"),
    ("orders", "ORDERS"),
    ("caf\u00e9", "cafe\u0301"),  # composed, then decomposed (an older name)
    ("stra\u00dfe", "STRASSE"),  # casefold: the sharp s is "ss"
])
def test_a_topic_whose_folder_folds_to_anothers_is_refused(tmp_path: Path, first: str,
                                                           second: str) -> None:
    assert topic_directory(first) != topic_directory(second)
    assert folded(topic_directory(first)) == folded(topic_directory(second))
    archived(tmp_path, first)
    record_topic_directories(tmp_path, {first})  # its own folder: on it goes
    with pytest.raises(DirectoryTaken, match="case-insensitive or normalising filesystem"):
        record_topic_directories(tmp_path, {second})
    assert sorted(p.name for p in (tmp_path / "messages").iterdir()) == [
        topic_directory(first)]


def test_the_deliveries_dataset_is_checked_too(tmp_path: Path) -> None:
    archived(tmp_path, "Orders", dataset="deliveries")
    with pytest.raises(DirectoryTaken, match=r"is 'topic=Orders', another topic's"):
        record_topic_directories(tmp_path, {"orders"})


def test_topics_that_differ_otherwise_share_nothing(tmp_path: Path) -> None:
    archived(tmp_path, "orders")
    record_topic_directories(tmp_path, {"orders.created", "order", "Orders2"})
    record_topic_directories(tmp_path / "empty", {"orders"})  # nothing archived yet


def test_two_folders_an_older_version_wrote_go_on_as_they_were(tmp_path: Path) -> None:
    # On a case-sensitive filesystem an older version wrote both: each keeps its own.
    archived(tmp_path, "Orders")
    archived(tmp_path, "orders")
    record_topic_directories(tmp_path, {"Orders"})
    record_topic_directories(tmp_path, {"orders"})
