"""Trial F16 (issue 53): why a runner stopped, as its ``StopRecord`` notes it (no
database: the row it writes is tests/integration/test_runner_control.py's and the real
process tests/acceptance/test_runner_stop_causes.py's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from sqlqueue.consuming import supervisor
from sqlqueue.consuming.control import StopRecord


def test_the_first_cause_counts_and_recycling_counts_over_its_signal() -> None:
    record = StopRecord("w", "default")
    record.note("signal", "SIGTERM")
    record.note("signal", "SIGINT")  # a second signal does not rename the first
    assert (record.cause, record.by) == ("signal", "SIGTERM")
    record.recycled()  # the supervisor's note, read after its SIGTERM was handled
    assert (record.cause, record.by) == ("recycle", "--max-memory")


def test_the_runners_signal_handler_is_wrapped_not_replaced() -> None:
    called: list[int] = []
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: called.append(signum))
    try:
        record = StopRecord("w", "default")
        record.watch_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not called and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler runs between bytecodes of the main thread
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert called == [signal.SIGTERM]
    assert (record.cause, record.by) == ("signal", "SIGTERM")


def test_the_supervisor_gone_is_noted_before_the_stop() -> None:
    record = StopRecord("w", "default")
    seen: list[Any] = []
    record.noting_supervisor_gone(lambda: seen.append(record.cause))()
    assert seen == ["supervisor"]


def test_the_supervisor_notes_a_recycling_on_the_lifeline_before_its_sigterm() -> None:
    read_end, write_end = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        boss = supervisor.Supervisor(lambda slot, fd: [], 1, max_memory_mb=0.001)
        boss.workers[0] = supervisor.Worker(0, child, write_end, time.monotonic())
        boss._recycle_big()
        assert child.wait(30) == -signal.SIGTERM
        assert os.read(read_end, 16) == supervisor.RECYCLE_NOTE
    finally:
        child.kill()
        child.wait()
        os.close(read_end)
        os.close(write_end)


def test_the_worker_reads_the_note_and_still_stops_at_end_of_file() -> None:
    read_end, write_end = os.pipe()
    events: list[str] = []
    watcher = threading.Thread(target=supervisor._watch_lifeline, args=(
        read_end, lambda: events.append("stop"), lambda: events.append("recycled")))
    watcher.start()
    os.write(write_end, supervisor.RECYCLE_NOTE)
    os.close(write_end)  # the supervisor exits
    watcher.join(30)
    os.close(read_end)
    assert events == ["recycled", "stop"]
