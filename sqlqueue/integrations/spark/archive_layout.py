"""Where the archive's files go (sqlqueue.integrations.spark.archive): the names of its
state, journal, lock and staging files, the Hive-style ``topic=<topic>`` directory of a
topic (escaped as Spark does, and cut with a hash past ``MAX_DIRECTORY_BYTES``), the
register of shortened directories (``TOPICS_FILE``), and an atomic JSON write for its
state files.
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from pathlib import Path
from typing import Any

from sqlqueue.exceptions import SqlqueueError

STATE_FILE = "_sqlqueue_archive.json"
JOURNAL_FILE = "_journal.json"
TOPICS_FILE = "_topics.json"
MAX_DIRECTORY_BYTES = 255  # NAME_MAX of ext4, xfs, btrfs, tmpfs, APFS, NTFS (in UTF-16)
LOCK_FILE = "_lock"
STAGING = "_staging"
#: characters Spark escapes in partition directory names (ExternalCatalogUtils)
HIVE_ESCAPED = set('"#%\'*/:=?\\\x7f{[]^')


def hive_escape(value: str) -> str:
    """A partition value as Spark writes it in a directory name (and unescapes it)."""
    return "".join(f"%{ord(ch):02X}" if ch in HIVE_ESCAPED or ord(ch) < 32 else ch
                   for ch in value)


#: the datasets, each a directory of topic directories
DATASETS = ("messages", "deliveries")


def folded(name: str) -> str:
    """``name`` as a case-insensitive or normalising filesystem compares it (macOS,
    Windows, some mounts and sync tools): ``topic=Orders`` and ``topic=orders``, or the
    composed and decomposed ``café``, are one folder there."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())


#: ends a shortened topic directory, before its hash: escaped in every topic (``%7E``, which
#: Spark unescapes), so that no topic's full directory is another's shortened one
SHORTENED_MARK = "~"


def topic_directory(topic: str) -> str:
    """``topic=<escaped topic>``, or, past ``MAX_DIRECTORY_BYTES``, its start (never half
    of an escape or of a character) plus ``~`` and a hash of the whole topic. A ``~`` of
    the topic is escaped too: only shortened directories hold one."""
    name = f"topic={hive_escape(topic).replace(SHORTENED_MARK, '%7E')}"
    if len(name.encode("utf-8")) <= MAX_DIRECTORY_BYTES:
        return name
    digest = hashlib.sha256(topic.encode("utf-8")).hexdigest()[:16]
    keep = MAX_DIRECTORY_BYTES - 1 - len(digest)
    prefix = name.encode("utf-8")[:keep].decode("utf-8", "ignore")
    cut_escape = prefix.rfind("%", len(prefix) - 2)
    if cut_escape != -1:
        prefix = prefix[:cut_escape]
    return f"{prefix}{SHORTENED_MARK}{digest}"


def is_shortened(directory: str) -> bool:
    """Whether a topic directory was cut (``_topics.json`` names its topic)."""
    return SHORTENED_MARK in directory


def write_json(path: Path, value: Any) -> None:
    """Atomically: a crash leaves the old file or the new one, never half of one."""
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w") as handle:
        json.dump(value, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


class DirectoryTaken(SqlqueueError):
    """A topic's shortened directory belongs to another topic, or holds files
    ``TOPICS_FILE`` does not name: the topic is not archived there."""


def record_topic_directories(directory: Path, topics: set[str]) -> None:
    """Check the directories of ``topics`` under ``directory`` and add the shortened ones
    to ``TOPICS_FILE``. Refused (``DirectoryTaken``), never shared: a directory that
    another topic's has the same name as, but for case or Unicode normalisation (one
    folder on macOS or Windows, wherever the archive is read); a shortened directory that
    ``TOPICS_FILE`` gives to another topic, or that holds files no entry names (another
    topic's, from an older version that did not escape ``~``)."""
    for topic in topics:
        _refuse_a_folded_namesake(directory, topic_directory(topic))
    shortened = {topic_directory(t): t for t in topics if is_shortened(topic_directory(t))}
    if not shortened:
        return
    path = directory / TOPICS_FILE
    known = json.loads(path.read_text()) if path.exists() else {}
    for name, topic in shortened.items():
        owner = known.get(name)
        if owner is None and any((directory / dataset / name).exists()
                                 for dataset in DATASETS):
            raise DirectoryTaken(f"its directory {name!r} holds files of a topic "
                                 f"{TOPICS_FILE} does not name")
        if owner is not None and owner != topic:
            raise DirectoryTaken(f"its directory {name!r} is the archive of topic "
                                 f"{owner[:80]!r}")
    if not shortened.items() <= known.items():
        write_json(path, {**known, **shortened})


def _refuse_a_folded_namesake(directory: Path, name: str) -> None:
    """A topic directory not written yet whose name another one's folds to (first come,
    first served: the topic archived there first keeps it). One already there (both
    written by a version before this check) goes on as it was."""
    for dataset in DATASETS:
        try:
            present = os.listdir(directory / dataset)
        except FileNotFoundError:
            continue
        if name in present:
            return
        namesake = next((other for other in present if folded(other) == folded(name)), None)
        if namesake is not None:
            raise DirectoryTaken(
                f"its directory {name!r} is {namesake!r}, another topic's, on a "
                "case-insensitive or normalising filesystem (macOS, Windows): archive one "
                "of the two topics into another directory (queue archive --topic)")
