"""Soak test: subscribers killed at random, subscribers paused (SIGSTOP) inside their cycle
transaction, and a database restart, while a producer publishes; then a report of what was
published, handled, lost, duplicated, redelivered early and run overlapping.

    .venv/bin/python -m bench.soak --minutes 10 --messages 100000 --kills 20 --pauses 10

Two groups consume the topic: ``soak`` (unordered) and ``soak-ordered``. A pause is made
inside a cycle transaction: the subscriber is stopped again and again at random moments
until one catches it with a transaction open (it then holds share locks on its lease rows
and row locks on what it wrote), and kept stopped for ``--pause-seconds`` (longer than the
lease and the visibility timeout). The others must go on: no message lost, none delivered
again before its visibility timeout ran out, no two runs in an ordered partition
overlapping, except where a paused process's own handler was frozen mid-run (the
visibility timeout then ran out under it, as it may, SPEC I10).

Needs a local MariaDB/MySQL this user may restart (``mysqladmin shutdown``, then
``start-stop-daemon ... mariadbd``); ``--no-db-restart`` skips that part. Not part of the
test suite: it runs for minutes by design (``make soak`` runs a short one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from bench.common import reset, setup

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "bench.soak"
GROUPS = ("soak", "soak-ordered")
#: database times come from several connections' clocks: allow this much disagreement
CLOCK_SLACK_MS = 50
SUBSCRIBER_SETTINGS = {"LEASE_DURATION": 4, "LEASE_RENEW_INTERVAL": 1, "VISIBILITY_TIMEOUT": 5,
                       "BATCH_SIZE": 50, "POLL_INTERVAL": 0.05}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def setup_soak(url: str) -> None:
    setup(url)
    from django.db import connection

    reset()
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS soak_journal")
        cursor.execute("CREATE TABLE soak_journal (grp VARCHAR(64) NOT NULL, "
                       "message_offset BIGINT NOT NULL, partition_key VARCHAR(64) NOT NULL, "
                       "attempt INT NOT NULL, pid INT NOT NULL, started_ms BIGINT NOT NULL, "
                       "finished_ms BIGINT NOT NULL, INDEX (grp, message_offset))")


class Subscribers:
    def __init__(self, count: int, url: str) -> None:
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
                    "BENCH_DATABASE_URL": url, "BENCH_BATCH": "50",
                    "BENCH_SQLQUEUE_JSON": json.dumps(SUBSCRIBER_SETTINGS)}
        self.processes: list[subprocess.Popen[bytes]] = [self._start(n) for n in range(count)]
        self.kills: list[Kill] = []
        self.pauses: list[Pause] = []

    def _start(self, n: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "runconsumer", "--group", "soak",
             "--group", "soak-ordered", "--name", f"soak-{n}-{time.monotonic_ns()}", "-v", "0"],
            cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL,
            stderr=open(f"/tmp/soak-subscriber-{n}.log", "ab"),
        )

    def kill_one(self) -> None:
        n = random.randrange(len(self.processes))
        victim = self.processes[n]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        # The local clock if the database is restarting (the same machine's, here).
        self.kills.append(Kill(victim.pid, database_now_ms_or(round(time.time() * 1000))))
        log(f"SIGKILL subscriber {n} (pid {victim.pid}); restarting it")
        self.processes[n] = self._start(n)

    def pause_one(self, seconds: float) -> None:
        """Stop a subscriber inside a cycle transaction (tries at random moments until a
        stop catches one open; at worst a plain pause), keep it stopped, resume it."""
        n = random.randrange(len(self.processes))
        victim = self.processes[n]
        inside = False
        for _ in range(PAUSE_TRIES):
            victim.send_signal(signal.SIGSTOP)
            if transaction_left_open():
                inside = True
                break
            victim.send_signal(signal.SIGCONT)
            time.sleep(random.uniform(0.0, 0.2))
        else:
            victim.send_signal(signal.SIGSTOP)
        began = database_now_ms_or(0)
        log(f"SIGSTOP subscriber {n} (pid {victim.pid}) "
            f"{'inside' if inside else 'outside'} a transaction, for {seconds:.0f}s")
        time.sleep(seconds)
        victim.send_signal(signal.SIGCONT)
        self.pauses.append(Pause(victim.pid, began - PAUSE_SLACK_MS,
                                 database_now_ms_or(1 << 62) + PAUSE_SLACK_MS, inside))

    def restart_dead(self) -> None:
        for n, process in enumerate(self.processes):
            if process.poll() is not None:
                log(f"subscriber {n} exited with {process.returncode}; restarting it")
                self.processes[n] = self._start(n)

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


PAUSE_TRIES = 60
#: the pause's edges are read around the signals: widen them a little
PAUSE_SLACK_MS = 500


@dataclass(frozen=True)
class Outage:
    """The database restart, in the same machine's clock (the database's own is away)."""

    began_ms: int
    ended_ms: int

    def failed(self, run: Run) -> bool:
        """Could ``run``'s handler have failed on the lost connection? Its own write (the
        journal row) can commit while the handler gets "lost connection": the message is
        then retried after its backoff (SPEC I9), not held for a visibility timeout."""
        return (run.started_ms <= self.ended_ms + OUTAGE_SLACK_MS
                and run.finished_ms >= self.began_ms - OUTAGE_SLACK_MS)


OUTAGE_SLACK_MS = 1000


@dataclass(frozen=True)
class Kill:
    pid: int
    at_ms: int  # database clock, read right after the process died

    def cut_short(self, run: Run) -> bool:
        """Did this kill come before ``run``'s outcome could be recorded? Its message then
        comes back once the visibility timeout is over, counted from its delivery, which
        preceded the run by its wait in the process's queue: not an early redelivery."""
        timeout_ms = SUBSCRIBER_SETTINGS["VISIBILITY_TIMEOUT"] * 1000
        return run.pid == self.pid and run.started_ms <= self.at_ms <= run.started_ms + timeout_ms


@dataclass(frozen=True)
class Pause:
    pid: int
    began_ms: int
    ended_ms: int
    inside_transaction: bool

    def held_up(self, run: Run) -> bool:
        """Could ``run`` be of a delivery its process made before this pause, that the
        pause kept from running until the visibility timeout had run out? (A pause inside
        the cycle transaction that marks it commits that delivery only at its end.)"""
        timeout_ms = SUBSCRIBER_SETTINGS["VISIBILITY_TIMEOUT"] * 1000
        return (run.pid == self.pid
                and self.began_ms <= run.started_ms <= self.ended_ms + timeout_ms)

    def froze(self, run: Run) -> bool:
        """Was ``run`` (a handler run of the paused process) frozen by this pause?"""
        return (run.pid == self.pid and run.started_ms <= self.ended_ms
                and run.finished_ms >= self.began_ms)


@dataclass(frozen=True)
class Run:
    group: str
    offset: int
    partition_key: str
    attempt: int
    pid: int
    started_ms: int
    finished_ms: int


def database_now_ms() -> int:
    from django.db import connection

    from sqlqueue.storage.sql import dialect_for

    with connection.cursor() as cursor:
        return dialect_for(connection).database_now_ms(cursor)


def database_now_ms_or(fallback: int) -> int:
    """The database clock, or ``fallback`` while the database restarts (a pause's edge
    then widens to cover everything: no run is wrongly blamed)."""
    from django.db import DatabaseError, connection

    try:
        return database_now_ms()
    except DatabaseError:
        connection.close()
        return fallback


def transaction_left_open() -> bool:
    """Right after a SIGSTOP: is a transaction left open with no statement running, for
    longer than any live one stays so? (InnoDB refreshes INNODB_TRX only after 0.1 s
    without readers, hence the spaced reads.)"""
    from django.db import connection

    def idle_transactions() -> set[str]:
        with connection.cursor() as cursor:
            # Only this soak's database: the server may serve others.
            cursor.execute("SELECT t.trx_id FROM information_schema.INNODB_TRX t "
                           "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                           "WHERE t.trx_query IS NULL AND t.trx_state = 'RUNNING' "
                           "AND p.DB = DATABASE()")
            return {str(r[0]) for r in cursor.fetchall()}

    from django.db import DatabaseError

    try:
        time.sleep(0.25)
        first = idle_transactions()
        if not first:
            return False
        time.sleep(0.4)
        return bool(first & idle_transactions())
    except DatabaseError:  # the database restarting: not now
        connection.close()
        return False


def restart_database() -> float:
    started = time.monotonic()
    log("restarting the database server")
    subprocess.run(["mysqladmin", "--user=root", "shutdown"], check=False)
    while subprocess.run(["mysqladmin", "--user=root", "ping"], capture_output=True,
                         check=False).returncode == 0:
        time.sleep(0.2)
    subprocess.run(["start-stop-daemon", "--start", "--oknodo", "--background", "--exec",
                    "/usr/sbin/mariadbd"], check=True)
    while subprocess.run(["mysqladmin", "--user=root", "ping"], capture_output=True,
                         check=False).returncode != 0:
        time.sleep(0.2)
    took = time.monotonic() - started
    log(f"database back after {took:.1f}s")
    return took


def produce(total: int, seconds: float, done: threading.Event, published: list[int]) -> None:
    """Publish ``total`` messages evenly over ``seconds``, in batches of 100, with ids so
    that a batch retried after a lost connection is not published twice."""
    from django.db import DatabaseError, connection, transaction

    from sqlqueue import OutgoingMessage, send_messages

    batch = 100
    started = time.monotonic()
    n = 0
    while n < total:
        messages = [OutgoingMessage({"n": i}, partition_key=f"p{i % 32:02d}", id=f"soak-{i}")
                    for i in range(n, min(n + batch, total))]
        try:
            with transaction.atomic():
                sent = send_messages(TOPIC, messages)
        except DatabaseError as exc:
            log(f"producer: {exc.__class__.__name__}; retrying the batch")
            connection.close()
            time.sleep(0.5)
            continue
        published.extend(s.offset for s in sent if s.created)
        n += len(messages)
        ahead = started + seconds * n / total - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    done.set()


def journal_counts() -> tuple[int, int]:
    """Handler runs, and distinct messages handled by every group (the lesser count)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM soak_journal")
        rows = int(cursor.fetchone()[0])
        cursor.execute("SELECT grp, COUNT(DISTINCT message_offset) FROM soak_journal "
                       "GROUP BY grp")
        per_group = {g: int(c) for g, c in cursor.fetchall()}
    return rows, min(per_group.get(g, 0) for g in GROUPS)


def journal_runs() -> list[Run]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT grp, message_offset, partition_key, attempt, pid, started_ms, "
                       "finished_ms FROM soak_journal")
        return [Run(g, int(o), k, int(a), int(p), int(s), int(f))
                for g, o, k, a, p, s, f in cursor.fetchall()]


def early_redeliveries(runs: list[Run], pauses: list[Pause], kills: list[Kill],
                       outages: list[Outage]) -> int:
    """Runs of a message that started before the visibility timeout of the run before it
    ran out, that run's process neither frozen by a pause nor killed before its outcome
    was recorded, and that run not caught by the database restart (SPEC I10)."""
    timeout_ms = SUBSCRIBER_SETTINGS["VISIBILITY_TIMEOUT"] * 1000
    by_message: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for run in runs:
        by_message[(run.group, run.offset)].append(run)
    early = 0
    for deliveries in by_message.values():
        deliveries.sort(key=lambda r: r.started_ms)
        for before, after in itertools.pairwise(deliveries):
            # A later run of an earlier attempt is not a redelivery: it is the first
            # delivery's run, held up by a pause of its process while the redelivery (on
            # time) went to another one.
            late_original = after.attempt < before.attempt or any(
                p.held_up(after) for p in pauses)
            if (after.started_ms < before.started_ms + timeout_ms - CLOCK_SLACK_MS
                    and not late_original
                    and not any(p.froze(before) for p in pauses)
                    and not any(k.cut_short(before) for k in kills)
                    and not any(o.failed(before) for o in outages)):
                early += 1
    return early


def ordered_overlaps(runs: list[Run], pauses: list[Pause]) -> int:
    """Pairs of runs in one partition of the ordered group that overlapped in time, the
    first not frozen by a pause (SPEC I5)."""
    by_partition: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if run.group == "soak-ordered":
            by_partition[run.partition_key].append(run)
    overlaps = 0
    for partition_runs in by_partition.values():
        partition_runs.sort(key=lambda r: r.started_ms)
        for before, after in itertools.pairwise(partition_runs):
            if (after.started_ms < before.finished_ms - CLOCK_SLACK_MS
                    and not any(p.froze(before) for p in pauses)):
                overlaps += 1
    return overlaps


def main() -> None:
    parser = argparse.ArgumentParser(description="sqlqueue soak test")
    parser.add_argument("--url", default="mysql://root@127.0.0.1:3306/sqlqueue_soak")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--pauses", type=int, default=0,
                        help="subscribers stopped inside a cycle transaction")
    parser.add_argument("--pause-seconds", type=float, default=8.0)
    parser.add_argument("--no-db-restart", action="store_true")
    parser.add_argument("--drain-timeout", type=float, default=600)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()

    setup_soak(args.url)
    from django.db import DatabaseError, connection

    seconds = args.minutes * 60
    subscribers = Subscribers(args.subscribers, args.url)
    published: list[int] = []
    produced = threading.Event()
    producer = threading.Thread(target=produce, args=(args.messages, seconds * 0.8, produced,
                                                      published), daemon=True)
    started = time.monotonic()
    producer.start()
    kill_times = sorted(random.uniform(0.05, 0.95) * seconds for _ in range(args.kills))
    pause_times = sorted(random.uniform(0.05, 0.8) * seconds for _ in range(args.pauses))
    restart_at = None if args.no_db_restart else seconds * 0.5
    restart_seconds = 0.0
    outages: list[Outage] = []
    while time.monotonic() - started < seconds:
        elapsed = time.monotonic() - started
        if kill_times and elapsed >= kill_times[0]:
            kill_times.pop(0)
            subscribers.kill_one()
        if pause_times and elapsed >= pause_times[0]:
            pause_times.pop(0)
            subscribers.pause_one(args.pause_seconds)
        if restart_at is not None and elapsed >= restart_at:
            restart_at = None
            began = round(time.time() * 1000)
            restart_seconds = restart_database()
            outages.append(Outage(began, round(time.time() * 1000)))
            connection.close()
        subscribers.restart_dead()
        time.sleep(0.2)
    producer.join()
    log(f"published {len(published)}; waiting for the subscribers to finish")
    deadline = time.monotonic() + args.drain_timeout
    handled = 0
    while time.monotonic() < deadline:
        try:
            rows, handled = journal_counts()
        except DatabaseError:
            connection.close()
            continue
        if handled >= len(published):
            break
        subscribers.restart_dead()
        time.sleep(1)
    subscribers.stop()
    rows, handled = journal_counts()
    runs = journal_runs()
    lost = sum(len(set(published) - {r.offset for r in runs if r.group == group})
               for group in GROUPS)
    report = {
        "minutes": round((time.monotonic() - started) / 60, 1),
        "subscribers": args.subscribers,
        "published": len(published),
        "handled": handled,
        "lost": lost,
        "duplicates": rows - handled * len(GROUPS),
        "early_redeliveries": early_redeliveries(runs, subscribers.pauses, subscribers.kills,
                                                 outages),
        "ordered_overlaps": ordered_overlaps(runs, subscribers.pauses),
        "kills": len(subscribers.kills),
        "pauses": len(subscribers.pauses),
        "pauses_inside_a_transaction": sum(p.inside_transaction for p in subscribers.pauses),
        "pause_seconds": args.pause_seconds,
        "database_restarts": 0 if args.no_db_restart else 1,
        "database_restart_seconds": round(restart_seconds, 1),
        "settings": SUBSCRIBER_SETTINGS,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    failed = lost or report["early_redeliveries"] or report["ordered_overlaps"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
