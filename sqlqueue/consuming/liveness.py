"""The liveness signal of a running ``runconsumer``: a file whose modification time is the
last turn of the runner's loop (``--liveness-file``), readable without a database
(``manage.py queue health --liveness-file``, or ``stat`` in a shell probe)."""

from __future__ import annotations

import os


def touch(path: str) -> None:
    """Mark one turn of the loop."""
    try:
        os.utime(path)
    except FileNotFoundError:
        with open(path, "a"):
            pass
