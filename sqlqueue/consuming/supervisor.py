"""``runconsumer --processes N``: one supervisor process and N worker processes.

Each worker is a plain ``runconsumer`` run in a child process (the same options, less the
supervisor's own), so it shares nothing with its siblings but the database: leases split
the partitions among them as among any subscribers. The supervisor never touches the
database. It

* restarts a worker that crashed, after a backoff that grows with repeated crashes;
* replaces at once a worker that stopped after ``--max-messages-per-child`` messages
  (``EXIT_RECYCLE``), that a stuck handler made stop (``EXIT_STUCK``), or that it told to
  stop because its resident memory passed ``--max-memory``;
* forwards the first SIGTERM/SIGINT to every worker (they finish their in-flight
  handlers, give back what no handler started, hand their partitions over and exit),
  then exits 0; a second one is forwarded too, and the workers exit at once;
* never leaves orphans: each worker holds the read end of a pipe (its lifeline) whose
  only write end lives in the supervisor, and stops when it reads end-of-file; on Linux
  the kernel also sends it SIGTERM when the supervisor dies (``PR_SET_PDEATHSIG``), which
  covers even a worker busy starting up.

Workers run in process groups of their own: a Ctrl-C at a terminal reaches the
supervisor only, which forwards it once (not twice, which would mean "at once").
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.handoff import EXIT_STUCK

logger = logging.getLogger("sqlqueue.supervisor")

#: Exit status of a supervised worker that handled its --max-messages-per-child messages.
EXIT_RECYCLE = 76
TICK = 0.5  # seconds between looks at the workers (a signal or an exit ends it early)
RESTART_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # after 1, 2, ... crashes in a row
STABLE_AFTER = 30.0  # a worker that ran this long resets its slot's crash count
KILL_AFTER_MARGIN = 10.0  # past SHUTDOWN_TIMEOUT, a worker told to stop is killed
SECOND_SIGNAL_WAIT = 5.0  # after the second signal, how long workers get to exit
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass
class Worker:
    slot: int
    process: subprocess.Popen[bytes]
    lifeline: int  # the pipe's write end, held open by the supervisor only
    started: float
    told_to_stop: float | None = None  # monotonic time it was told to stop (recycling)
    signals: int = 0  # how many of the supervisor's signals were forwarded to it

    @property
    def pid(self) -> int:
        return self.process.pid


class Supervisor:
    def __init__(self, command: Callable[[int, int], list[str]], processes: int, *,
                 until_empty: bool = False, max_memory_mb: float | None = None,
                 shutdown_timeout: float = 30.0,
                 host_clock: HostClock = SYSTEM_CLOCK) -> None:
        """``command(slot, lifeline_fd)``: the argv of the worker for ``slot``."""
        self.host_clock = host_clock
        self.command = command
        self.processes = processes
        self.until_empty = until_empty
        self.max_memory_bytes = None if max_memory_mb is None else max_memory_mb * 2**20
        self.shutdown_timeout = shutdown_timeout
        self.workers: dict[int, Worker] = {}
        self._crashes = [0] * processes
        self._restart_at: dict[int, float] = {}  # slot -> monotonic time of its restart
        self._finished: set[int] = set()  # --until-empty: slots whose worker is done
        self._signals = 0
        self._wake = threading.Event()

    # -- lifecycle ------------------------------------------------------------------------
    def run(self) -> int:
        self._install_signal_handlers()
        logger.info("Supervisor %s starting %s worker process(es).", os.getpid(),
                    self.processes)
        for slot in range(self.processes):
            self._start(slot)
        while self.workers or (self._restart_at and not self._signals):
            self._wake.wait(TICK)
            self._wake.clear()
            if self._signals >= 2:
                return self._exit_at_once()
            self._reap()
            if self._signals:
                self._forward_to_late_starters()
            else:
                self._restart_due()
                self._recycle_big()
            self._kill_overdue()
        logger.info("Supervisor %s: every worker has exited.", os.getpid())
        return 0

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, frame: Any) -> None:
            self._signals += 1
            if self._signals == 1:
                logger.warning("Signal %s: telling %s worker(s) to finish their in-flight "
                               "handlers and exit; signal again to stop them at once.",
                               signum, len(self.workers))
            else:
                logger.warning("Second signal: stopping the workers at once.")
            for worker in self.workers.values():
                self._forward(worker)
            self._wake.set()

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)
        # A worker's exit ends the wait at once (reaped and replaced without a tick's delay).
        signal.signal(signal.SIGCHLD, lambda signum, frame: self._wake.set())

    def _forward(self, worker: Worker) -> None:
        worker.signals += 1
        self._signal(worker, signal.SIGTERM)

    def _forward_to_late_starters(self) -> None:
        """A worker started while the signal arrived (between Popen and its entry in
        ``workers``) is told now."""
        for worker in self.workers.values():
            if worker.signals == 0:
                self._forward(worker)

    def _exit_at_once(self) -> int:
        """Second signal: the workers were told twice (they exit at once); make sure."""
        deadline = self.host_clock.monotonic() + SECOND_SIGNAL_WAIT
        while self.workers and self.host_clock.monotonic() < deadline:
            self._reap()
            self.host_clock.sleep(0.05)
        for worker in list(self.workers.values()):
            self._signal(worker, signal.SIGKILL)
            worker.process.wait()
            self._forget(worker)
        return 1

    # -- workers ------------------------------------------------------------------------------
    def _start(self, slot: int) -> None:
        read_end, write_end = os.pipe()  # not inheritable (PEP 446): the worker gets one end
        try:
            process = subprocess.Popen(self.command(slot, read_end), pass_fds=(read_end,),
                                       process_group=0)
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self.workers[slot] = Worker(slot, process, write_end, self.host_clock.monotonic())
        logger.info("Worker %s started (pid %s).", slot, process.pid)

    def _reap(self) -> None:
        for worker in list(self.workers.values()):
            status = worker.process.poll()
            if status is not None:
                self._forget(worker)
                self._after_exit(worker, status)

    def _forget(self, worker: Worker) -> None:
        del self.workers[worker.slot]
        with contextlib.suppress(OSError):
            os.close(worker.lifeline)

    def _after_exit(self, worker: Worker, status: int) -> None:
        """Decide what comes after a worker's exit: nothing (stopping, or --until-empty
        found nothing left), a new worker at once (recycling), or after a backoff."""
        lived = self.host_clock.monotonic() - worker.started
        if self._signals:
            logger.info("Worker %s (pid %s) exited with status %s.", worker.slot, worker.pid,
                        status)
            return
        if status == 0 and self.until_empty and worker.told_to_stop is None:
            logger.info("Worker %s (pid %s) found nothing left to do.", worker.slot, worker.pid)
            self._finished.add(worker.slot)
            return
        if status in (EXIT_RECYCLE, EXIT_STUCK) or worker.told_to_stop is not None:
            why = {EXIT_RECYCLE: "handled its --max-messages-per-child",
                   EXIT_STUCK: "had a handler stuck past its timeout"}.get(
                       status, "passed --max-memory")
            logger.info("Worker %s (pid %s) %s; replacing it.", worker.slot, worker.pid, why)
            self._crashes[worker.slot] = 0
            self._restart_at[worker.slot] = self.host_clock.monotonic()
            return
        if lived >= STABLE_AFTER:
            self._crashes[worker.slot] = 0
        delay = RESTART_BACKOFF[min(self._crashes[worker.slot], len(RESTART_BACKOFF) - 1)]
        self._crashes[worker.slot] += 1
        logger.warning("Worker %s (pid %s) exited with status %s after %.1fs; restarting it "
                       "in %.1fs.", worker.slot, worker.pid, status, lived, delay)
        self._restart_at[worker.slot] = self.host_clock.monotonic() + delay

    def _restart_due(self) -> None:
        now = self.host_clock.monotonic()
        for slot, at in sorted(self._restart_at.items()):
            if at <= now:
                del self._restart_at[slot]
                self._start(slot)

    def _recycle_big(self) -> None:
        """Tell a worker whose resident memory passed --max-memory to stop (gracefully);
        it is replaced once it has exited, so the slots never overlap."""
        if self.max_memory_bytes is None:
            return
        for worker in self.workers.values():
            if worker.told_to_stop is None:
                rss = resident_bytes(worker.pid)
                if rss is not None and rss > self.max_memory_bytes:
                    logger.info("Worker %s (pid %s) uses %.0f MB; recycling it.", worker.slot,
                                worker.pid, rss / 2**20)
                    worker.told_to_stop = self.host_clock.monotonic()
                    self._signal(worker, signal.SIGTERM)

    def _kill_overdue(self) -> None:
        """A worker told to stop drains within SHUTDOWN_TIMEOUT by itself; one that does
        not (a handler stuck in C code ignoring everything) is killed."""
        limit = self.shutdown_timeout + KILL_AFTER_MARGIN
        for worker in self.workers.values():
            told = worker.told_to_stop
            if told is not None and self.host_clock.monotonic() - told > limit:
                logger.warning("Worker %s (pid %s) did not stop within %.0fs; killing it.",
                               worker.slot, worker.pid, limit)
                self._signal(worker, signal.SIGKILL)

    @staticmethod
    def _signal(worker: Worker, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            worker.process.send_signal(signum)


def resident_bytes(pid: int) -> int | None:
    """A process's resident set size, from /proc (None where there is none)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


# -- the worker's side -------------------------------------------------------------------------
def attach(lifeline: int, stop: Callable[[], None]) -> None:
    """In a worker: stop (gracefully) when the supervisor is gone, however it went."""
    _die_with_parent()
    watcher = threading.Thread(target=_watch_lifeline, args=(lifeline, stop), daemon=True,
                               name="sqlqueue-lifeline")
    watcher.start()


def _die_with_parent() -> None:
    """Linux: have the kernel send SIGTERM (the graceful first signal) to this process
    when its parent dies. Elsewhere the lifeline alone does it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        logger.debug("prctl(PR_SET_PDEATHSIG) is not available; the lifeline pipe remains.")


def _watch_lifeline(fd: int, stop: Callable[[], None]) -> None:
    """The supervisor never writes: the read returns only at end-of-file, when the last
    write end closed, that is, when the supervisor exited (or was killed)."""
    with contextlib.suppress(OSError):
        while os.read(fd, 1):
            pass
    logger.warning("The supervisor is gone: finishing in-flight handlers and exiting.")
    stop()
