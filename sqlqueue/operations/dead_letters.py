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
from sqlqueue.operations.log_browse import dead_letter_topics, group_dead_letter_topics


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
        # The detail's id when it is a string, else the row's own (as ``insert_replays``).
        original_id = detail["id"] if isinstance(detail.get("id"), str) else dead.id
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
#: dead letters one transaction of a bulk replay moves (one INSERT ... SELECT and one
#: DELETE); fewer on SQLite under Django 5.2 (999 parameters a statement)
REPLAY_CHUNK = 5_000


@dataclass
class BulkResult:
    done: int = 0
    missing: list[int] = field(default_factory=list)  # replayed or discarded meanwhile
    #: a walk (``replay_matching``) stopped at its bound while more dead letters matched
    more: bool = False


def replay_dead_letters(offsets: Iterable[int], *, using: str | None = None,
                        on_progress: Callable[[int], None] | None = None) -> BulkResult:
    """Replay the dead letters at ``offsets`` (as ``replay_dead_letter``), set-based:
    ``REPLAY_CHUNK`` at a time in offset order, each chunk one transaction (``_replay``).
    Interrupted, the chunks done stay done and the rest stay dead letters: none is lost
    or replayed twice, and no lock is held for long. ``on_progress(n)``: after each chunk,
    how many offsets were handled so far. An offset that is not a dead letter (replayed
    or discarded meanwhile, or never one) is reported missing."""
    alias = using or get_settings().DATABASE
    offsets = list(offsets)
    wanted = sorted({o for o in offsets if _is_offset(o)})
    result = BulkResult(missing=[o for o in offsets if not _is_offset(o)])
    step = _chunk(alias)
    for first in range(0, len(wanted), step):
        chunk = wanted[first:first + step]
        replayed = set(_replay(chunk, alias))
        result.done += len(replayed)
        result.missing += [o for o in chunk if o not in replayed]
        if on_progress is not None:
            on_progress(first + len(chunk))
    return result


def replay_matching(topics: Iterable[str], matching: QuerySet[DeadLetter] | None = None, *,
                    at_most: int = REPLAY_AT_MOST, using: str | None = None,
                    on_progress: Callable[[int], None] | None = None) -> BulkResult:
    """Replay the dead letters of the dead-letter ``topics`` (those ``matching`` matches,
    if given: any filter of the dead letters), at most ``at_most``, partition by partition
    and oldest first within each: a keyset walk of ``idx_topic_partition_offset``
    (``dead_letter_keys``), ``REPLAY_CHUNK`` index entries a step, each step's matches one
    transaction (``_replay``). No statement reads more than a step, however many match
    (no list of every offset, no sort of every match). ``on_progress(n)``: how many were
    replayed so far, after each transaction. ``more``: it stopped at ``at_most`` and at
    least one more matches."""
    alias = using or get_settings().DATABASE
    connection = connections[alias]
    store = storage.store(connection)
    step = _chunk(alias)
    result = BulkResult()
    for topic in sorted(set(topics)):
        after: tuple[str, int] | None = None
        while True:
            with connection.cursor() as cursor:
                keys = store.dead_letter_keys(cursor, topic, after, step)
            if not keys:
                break
            after = (keys[-1][1], keys[-1][0])
            offsets = _matches([offset for offset, _ in keys], matching)
            room = at_most - result.done
            if offsets and room <= 0:
                result.more = True
                return result
            if offsets:
                result.done += len(_replay(offsets[:room], alias))
                if on_progress is not None:
                    on_progress(result.done)
                if len(offsets) > room:
                    result.more = True
                    return result
            if len(keys) < step:
                break
    return result


def replay_dead_letters_of(*, using: str, group: str | None = None, topic: str | None = None,
                           at_most: int = REPLAY_AT_MOST,
                           on_progress: Callable[[int], None] | None = None) -> BulkResult:
    """``replay_matching`` of the dead letters of ``group`` (if given) from ``topic`` (if
    given): the walk reads ``topic``'s dead-letter topic, or those of the group's topics,
    or every dead-letter topic (``queue dead-letters replay --all``)."""
    if topic:
        topics = [topic + get_settings().DLQ_SUFFIX]
    else:
        topics = group_dead_letter_topics(using, group) if group else dead_letter_topics(using)
    matching = DeadLetter.objects.using(using).filter(consumer_group=group) if group else None
    return replay_matching(topics, matching, at_most=at_most, using=using,
                           on_progress=on_progress)


def _chunk(alias: str) -> int:
    return min(REPLAY_CHUNK, storage.store(connections[alias]).offsets_per_statement())


def _matches(offsets: list[int], matching: QuerySet[DeadLetter] | None) -> list[int]:
    """Those of ``offsets`` (a step of the walk, in its order) that ``matching`` matches,
    in the same order: primary-key lookups."""
    if matching is None:
        return offsets
    found = set(matching.filter(offset__in=offsets).order_by().values_list("offset", flat=True))
    return [offset for offset in offsets if offset in found]


def _replay(offsets: list[int], alias: str) -> list[int]:
    """One transaction of a bulk replay: lock the dead letters at ``offsets`` (those
    still dead letters), copy them back in one ``INSERT ... SELECT`` (``insert_replays``:
    the copies of one partition keep their order, and their ids and details are made by
    the statement) and delete them (``delete_dead_letters``). Returns the offsets
    replayed. Each statement counts what it did: a copy without its delete (or the
    reverse) rolls the transaction back."""
    with transaction.atomic(using=alias):
        locked = list(DeadLetter.objects.using(alias).select_for_update()
                      .filter(offset__in=offsets).order_by("offset")
                      .values_list("offset", flat=True))
        if not locked:
            return []
        connection = connections[alias]
        store = storage.store(connection)
        with connection.cursor() as cursor:
            copied = store.insert_replays(cursor, locked)
            deleted = store.delete_dead_letters(cursor, locked)
        if copied != len(locked) or deleted != len(locked):
            raise ReplayMismatch(f"Replaying {len(locked)} dead letters copied {copied} and "
                                 f"deleted {deleted}: rolled back.")
    return locked


class ReplayMismatch(SqlqueueError, RuntimeError):
    """A bulk replay's transaction copied or deleted another number of rows than it
    locked (never expected: the locked rows cannot change): rolled back whole."""


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
