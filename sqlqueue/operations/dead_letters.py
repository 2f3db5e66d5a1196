"""Dead letters: replay one to its consumer group, or discard it.

A dead letter is a row of ``<topic><DLQ_SUFFIX>`` whose ``consumer_group`` names the group
whose attempts failed. Replaying it publishes a copy to the original topic addressed to
that group only (``consumer_group`` set), so no other group sees it again (guarantees I6, I7),
and removes the dead letter, in one transaction.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.db import connections, transaction
from django.db.models import QuerySet

from sqlqueue import storage
from sqlqueue.conf import MAX_NAME_BYTES, get_settings
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.models import DeadLetter
from sqlqueue.storage.sql.base import ReplayWrite


class NotADeadLetter(SqlqueueError, LookupError):
    """The offset names no dead letter (never one, or already replayed or discarded)."""


@dataclass(frozen=True)
class Replayed:
    dead_letter_offset: int
    group: str
    topic: str
    partition_key: str
    offset: int  # of the new message in the original topic


def matching_dead_letters(*, using: str, group: str | None = None,
                          topic: str | None = None) -> QuerySet[DeadLetter]:
    """The dead letters of one database, of ``group`` and from ``topic`` if given, newest
    first (a lazy query: slice it)."""
    rows = DeadLetter.objects.using(using).all()
    if group:
        rows = rows.filter(consumer_group=group)
    if topic:
        rows = rows.filter(original_topic=topic)
    return rows.order_by("-offset")


def replay_dead_letter(offset: int, *, using: str | None = None) -> Replayed:
    """Redeliver a dead letter to the group that dead-lettered it, and to no other."""
    alias = using or get_settings().DATABASE
    with transaction.atomic(using=alias):
        dead = _locked_dead_letter(offset, alias)
        detail = dead.failure_detail if isinstance(dead.failure_detail, dict) else {}
        original_id = str(detail.get("id", dead.id))
        replay_detail = json.dumps({"replay_of": {
            "id": original_id, "offset": detail.get("offset"), "dead_letter_offset": offset,
        }})
        connection = connections[alias]
        with connection.cursor() as cursor:
            new_offset = storage.store(connection).insert_replay(
                cursor, dead_letter_offset=offset, replay_id=_replay_id(original_id, offset),
                detail=replay_detail,
            )
        dead.delete()
    return Replayed(offset, dead.consumer_group, dead.original_topic, dead.partition_key,
                    new_offset)


def discard_dead_letter(offset: int, *, using: str | None = None) -> None:
    """Delete a dead letter for good."""
    alias = using or get_settings().DATABASE
    with transaction.atomic(using=alias):
        _locked_dead_letter(offset, alias).delete()


#: at most this many dead letters in one bulk replay (``queue dead-letters replay --all``'s
#: ``--at-most`` default, the admin's "replay all matching"): the rest at the next one
REPLAY_AT_MOST = 100_000
#: dead letters one transaction of a bulk replay moves
REPLAY_CHUNK = 1_000


@dataclass
class BulkResult:
    done: int = 0
    missing: list[int] = field(default_factory=list)  # replayed or discarded meanwhile


def replay_dead_letters(offsets: Iterable[int], *, using: str | None = None,
                        on_progress: Callable[[int], None] | None = None) -> BulkResult:
    """Replay the dead letters at ``offsets`` (as ``replay_dead_letter``), set-based:
    ``REPLAY_CHUNK`` at a time in offset order, each chunk one transaction that locks
    its dead letters, copies them back in a statement or two (``insert_replays``, so the
    copies of one partition keep their order) and deletes them (``delete_dead_letters``).
    Interrupted, the chunks done stay done and the rest stay dead letters: none is lost
    or replayed twice, and no lock is held for long. ``on_progress(n)``: after each chunk,
    how many offsets were handled so far. An offset that is not a dead letter (replayed
    or discarded meanwhile, or never one) is reported missing."""
    alias = using or get_settings().DATABASE
    offsets = list(offsets)
    wanted = sorted({o for o in offsets if _is_offset(o)})
    result = BulkResult(missing=[o for o in offsets if not _is_offset(o)])
    for first in range(0, len(wanted), REPLAY_CHUNK):
        chunk = wanted[first:first + REPLAY_CHUNK]
        replayed = _replay_chunk(chunk, alias)
        result.done += len(replayed)
        result.missing += [o for o in chunk if o not in replayed]
        if on_progress is not None:
            on_progress(first + len(chunk))
    return result


def _replay_chunk(offsets: list[int], alias: str) -> set[int]:
    """One transaction of ``replay_dead_letters``: the offsets replayed."""
    with transaction.atomic(using=alias):
        found = (DeadLetter.objects.using(alias).select_for_update()
                 .filter(offset__in=offsets).order_by("offset")
                 .values_list("offset", "id", "failure_detail"))
        replays = [_replay_write(offset, dead_id, detail) for offset, dead_id, detail in found]
        connection = connections[alias]
        store = storage.store(connection)
        with connection.cursor() as cursor:
            for some in store.dead_letter_chunks(replays):
                store.insert_replays(cursor, some)
            store.delete_dead_letters(cursor, [r.dead_letter_offset for r in replays])
    return {r.dead_letter_offset for r in replays}


def _replay_write(offset: int, dead_id: str, detail: object) -> ReplayWrite:
    """What ``insert_replays`` writes for the dead letter at ``offset`` (the same id and
    detail as ``replay_dead_letter``'s)."""
    detail = detail if isinstance(detail, dict) else {}
    original_id = str(detail.get("id", dead_id))
    return ReplayWrite(offset, _replay_id(original_id, offset), json.dumps({"replay_of": {
        "id": original_id, "offset": detail.get("offset"), "dead_letter_offset": offset}}))


def _is_offset(offset: object) -> bool:
    return isinstance(offset, int) and not isinstance(offset, bool) and offset >= 1


def discard_dead_letters(offsets: Iterable[int], *, using: str | None = None,
                         on_progress: Callable[[int], None] | None = None) -> BulkResult:
    """``discard_dead_letter`` for each offset, one transaction each."""
    return _each(offsets, lambda offset: discard_dead_letter(offset, using=using), on_progress)


def _each(offsets: Iterable[int], operation: Callable[[int], object],
          on_progress: Callable[[int], None] | None) -> BulkResult:
    result = BulkResult()
    for n, offset in enumerate(offsets, start=1):
        try:
            operation(offset)
            result.done += 1
        except NotADeadLetter:
            result.missing.append(offset)
        if on_progress is not None:
            on_progress(n)
    return result


def _locked_dead_letter(offset: int, alias: str) -> DeadLetter:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
        raise NotADeadLetter(f"A dead letter's offset is a positive integer; got {offset!r}.")
    dead = DeadLetter.objects.using(alias).select_for_update().filter(offset=offset).first()
    if dead is None:
        raise NotADeadLetter(
            f"No dead letter at offset {offset}: it was replayed or discarded already, or "
            "that message is not a dead letter."
        )
    return dead


def _replay_id(original_id: str, dead_letter_offset: int) -> str:
    """Unique in the original topic: a dead letter is replayed at most once."""
    candidate = f"{original_id}~replay-{dead_letter_offset}"
    if len(candidate.encode("utf-8")) <= MAX_NAME_BYTES:
        return candidate
    digest = hashlib.sha256(original_id.encode("utf-8")).hexdigest()
    return f"sha256:{digest}~replay-{dead_letter_offset}"
