"""``queue dead-letters list | replay | discard``: the newest dead letters, and
redelivering or deleting them by offset or all that match ``--group``/``--topic``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, OutputWrapper

from sqlqueue.conf import get_settings
from sqlqueue.management.queue_verbs.common import alias_of, checked_alias
from sqlqueue.naming import escape_controls
from sqlqueue.operations.dead_letters import (
    REPLAY_AT_MOST,
    REPLAY_CHUNK,
    discard_dead_letters,
    matching_dead_letters,
    replay_dead_letters,
    replay_dead_letters_of,
)


def dead_letters(out: OutputWrapper, options: dict[str, Any]) -> None:
    """``list``, or ``replay``/``discard``."""
    if options["action"] == "list":
        list_dead_letters(out, options)
    else:
        replay_or_discard(out, options)


def list_dead_letters(out: OutputWrapper, options: dict[str, Any]) -> None:
    """The newest dead letters, up to ``--limit`` per database."""
    databases = ([checked_alias(options["database"])] if options["database"]
                 else get_settings().databases)
    rows = [(alias, row) for alias in databases
            for row in _matching(options, alias)[: options["limit"]]]
    if not rows:
        out.write("No dead letters.")
        return
    several = len(databases) > 1
    # Handler error text is anyone's: each cell escaped (what a terminal would obey) before
    # the columns are measured.
    table = [tuple(map(escape_controls, _dead_letter_columns(alias, row, several)))
             for alias, row in rows]
    header = DEAD_LETTER_HEADER + (("database",) if several else ())
    widths = [max(len(line[i]) for line in [header, *table]) for i in range(len(header))]
    for line in [header, *table]:
        out.write(_aligned(line, widths).rstrip())


#: the header row of ``queue dead-letters list`` (the last error is the last column)
DEAD_LETTER_HEADER = ("offset", "group", "topic/partition", "id", "attempts", "last error")


def _dead_letter_columns(alias: str, row: Any, several: bool) -> tuple[str, ...]:
    last_line = (row.last_error.strip().splitlines() or [""])[-1][:100]
    detail = row.failure_detail if isinstance(row.failure_detail, dict) else {}
    columns = (str(row.offset), row.consumer_group, f"{row.original_topic}/{row.partition_key}",
               str(detail.get("id", row.id)), str(row.failure_count), last_line)
    return columns + ((alias,) if several else ())


def _aligned(line: tuple[str, ...], widths: list[int]) -> str:
    """Numbers (offset, attempts) to the right, text to the left, two spaces apart."""
    cells = [cell.rjust(width) if index in (0, 4) else cell.ljust(width)
             for index, (cell, width) in enumerate(zip(line, widths, strict=True))]
    return "  ".join(cells)


def replay_or_discard(out: OutputWrapper, options: dict[str, Any]) -> None:
    """Replay or discard the given offsets, or every match of ``--all``."""
    action = options["action"]
    alias = checked_alias(options["database"] or (
        alias_of(options["topic"]) if options["topic"] else None))
    if options["all"] and options["offsets"]:
        raise CommandError("Give offsets or --all, not both.")
    if options["all"] and action == "replay":
        replay_all(out, options, alias)
        return
    if options["all"]:
        if not options["yes"]:
            raise CommandError("Discarding every matching dead letter deletes them for "
                               "good: add --yes to confirm.")
        at_most = options.get("at_most") or REPLAY_AT_MOST
        # The oldest first, partition by partition: the read stops at the bound.
        offsets = list(_matching(options, alias).order_by("topic", "partition_key", "offset")
                       .values_list("offset", flat=True)[:at_most + 1])
        if len(offsets) > at_most:
            offsets = offsets[:at_most]
            out.write(f"More than {at_most} match: {action}ing the first {at_most} "
                      "(partition by partition, oldest first); run again for the rest, "
                      "or raise --at-most.")
    else:
        offsets = options["offsets"]
    if not offsets:
        raise CommandError("Nothing to do: give dead-letter offsets, or --all.")
    total = len(offsets)

    def progress(n: int) -> None:  # on long bulk operations (a replay: after each chunk)
        if n % 100 == 0 or n == total:
            out.write(f"  {n}/{total}", ending="\n" if n == total else "\r")

    bulk = replay_dead_letters if action == "replay" else discard_dead_letters
    result = bulk(sorted(offsets), on_progress=progress, using=alias)
    verb = "Replayed" if action == "replay" else "Discarded"
    out.write(f"{verb} {result.done} dead letter(s).")
    if result.missing:
        raise CommandError(
            f"No dead letter at offset(s) {', '.join(map(str, result.missing))}.")


def replay_all(out: OutputWrapper, options: dict[str, Any], alias: str) -> None:
    """``replay --all``: every dead letter of ``--group`` and ``--topic``, at most
    ``--at-most``, partition by partition and oldest first, walked by the index
    (``replay_dead_letters_of``), ``REPLAY_CHUNK`` a transaction, with progress."""
    at_most = options.get("at_most") or REPLAY_AT_MOST
    out.write(f"Replaying at most {at_most} dead letter(s), up to {REPLAY_CHUNK} a "
              "transaction.")

    def progress(done: int) -> None:
        out.write(f"  {done} replayed", ending="\r")

    result = replay_dead_letters_of(using=alias, group=options.get("group"),
                                    topic=options.get("topic"), at_most=at_most,
                                    on_progress=progress)
    out.write("")
    if result.more:
        out.write(f"More than {at_most} match: replayed the first {at_most} (partition by "
                  "partition, oldest first); run again for the rest, or raise --at-most.")
    if not result.done:
        raise CommandError("No dead letter matches.")
    out.write(f"Replayed {result.done} dead letter(s).")


def _matching(options: dict[str, Any], alias: str) -> Any:
    """The dead letters in ``alias`` matching ``--group``/``--topic``, newest first."""
    return matching_dead_letters(using=alias, group=options.get("group"),
                                 topic=options.get("topic"))
