"""The liveness signal of a running ``runconsumer``: a file whose modification time is the
last turn of the runner's loop (``--liveness-file``), readable without a database
(``manage.py queue health --liveness-file``, or ``stat`` in a shell probe). Its lines, if
any, are what the runner wants a probe to warn about (a deaf wake-up listener)."""

from __future__ import annotations

import os
from collections.abc import Sequence

#: what each file says now (written again only when it changes)
_written: dict[str, tuple[str, ...]] = {}


def touch(path: str, notes: Sequence[str] = ()) -> None:
    """Mark one turn of the loop; the file's lines are ``notes`` (none: empty)."""
    notes = tuple(note.replace("\n", " ") for note in notes)
    if _written.get(path) != notes:  # the first time too: nothing left from before
        with open(path, "w") as file:
            file.write("".join(f"{note}\n" for note in notes))
        _written[path] = notes
        return
    try:
        os.utime(path)
    except FileNotFoundError:
        with open(path, "a"):
            pass


def notes(path: str) -> list[str]:
    """The lines of a liveness file (``touch``'s ``notes``)."""
    with open(path) as file:
        return [line.strip() for line in file if line.strip()]
