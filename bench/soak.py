"""Soak: real ``runconsumer`` processes killed (SIGKILL) and frozen (SIGSTOP, inside their
cycle transaction when a stop catches one, or past their lease while one of their long
ordered runs is in flight: ``--freezes``) at random, the queue's rows locked by another
program now and then, and the database server restarted, while a producer publishes with
late commits and rollbacks; then the run's history is checked for every invariant of
SPEC §7/§10 (tests/history: the checker the test suite uses).

    .venv/bin/python -m bench.soak --minutes 30 --messages 100000 --kills 20 --pauses 6
    .venv/bin/python -m bench.soak --database postgresql --minutes 30 ...

The database server is the soak's own: a ``mariadbd`` (or ``postgres``) it starts in a
temporary directory on a free port, restarts, and stops at the end (never the machine's
shared server). ``--url`` runs against a server you name instead, and then never restarts
it (``--no-db-restart`` is implied).

Three groups consume the topic: ``soak`` (unordered), ``soak-ordered`` and
``soak-batch`` (an ordered batch consumer, issue 55). The seed
(``--seed``, printed) chooses the faults' times and the producer's choices; the history is
written to ``--history`` (JSON, with the subscribers' lease events, which each process
appends to a file of its own: ``tests.history.lease_log``;
``tests.history.model.History.load`` reads it back, and
``python -m bench.soak --check FILE`` checks it again). Exit status 1 on any violation or a
message not done in time. ``make soak`` runs a short one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from bench.common import reset, setup

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "bench.soak"
GROUPS = ("soak", "soak-ordered", "soak-batch")
#: the visibility timeout outlasts a long run (bench/consumers.py) frozen past the lease
#: (--freezes): the new holder of its partition must wait for it (issue 51)
SUBSCRIBER_SETTINGS = {"LEASE_DURATION": 4, "LEASE_RENEW_INTERVAL": 1, "VISIBILITY_TIMEOUT": 15,
                       "BATCH_SIZE": 50, "POLL_INTERVAL": 0.05, "MIN_BACKOFF": 0.2,
                       "MAX_BACKOFF": 2, "MAX_ATTEMPTS": 5}
PAUSE_TRIES = 60


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {text}", flush=True)


def now_ms() -> float:
    return time.time() * 1000


# -- the database server: the soak's own ------------------------------------------------------

@contextlib.contextmanager
def own_server(kind: str) -> Iterator[object]:
    """A database server of the soak's own (tests/acceptance/servers.py), stopped at the
    end; its URL is ``server.url("sqlqueue_soak")``."""
    from tests.acceptance import servers

    if kind == "postgresql":
        if not servers.can_start_postgresql():
            sys.exit("bench.soak: cannot start a PostgreSQL of its own here (needs root, "
                     "Debian's postgresql-15 and a postgres user); use --url")
        with servers.own_postgresql() as postgres:
            postgres.create_database("sqlqueue_soak")
            yield postgres
        return
    if not servers.can_start_mariadb():
        sys.exit("bench.soak: cannot start a mariadbd of its own here (needs root and "
                 "mariadb-install-db); use --url")
    with tempfile.TemporaryDirectory(prefix="sqlqueue-soak-") as root, \
            servers.own_mariadb(Path(root)) as mariadb:
        mariadb.sql("CREATE DATABASE sqlqueue_soak CHARACTER SET utf8mb4")
        yield mariadb


def setup_soak(url: str) -> None:
    setup(url)
    from django.db import connection

    reset()
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS soak_journal")
        cursor.execute(
            "CREATE TABLE soak_journal (grp VARCHAR(64) NOT NULL, "
            "message_offset BIGINT NOT NULL, partition_key VARCHAR(64) NOT NULL, "
            "msg_id VARCHAR(255) NOT NULL, attempt INT NOT NULL, pid INT NOT NULL, "
            "started_ms DOUBLE PRECISION NOT NULL, finished_ms DOUBLE PRECISION NOT NULL, "
            "outcome VARCHAR(16) NOT NULL, visible_until DOUBLE PRECISION NULL, "
            "batch VARCHAR(64) NOT NULL DEFAULT '')")


# -- the subscribers ------------------------------------------------------------------------

class Subscribers:
    def __init__(self, count: int, url: str, history: object, rng: random.Random,
                 folder: Path) -> None:
        from tests.history.model import History

        assert isinstance(history, History)
        self.history = history
        self.random = rng
        #: where the subscribers write their lease events and long runs' marker files
        self.folder = folder
        self.freezes = 0
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
                    "BENCH_DATABASE_URL": url, "BENCH_BATCH": "50",
                    "BENCH_SQLQUEUE_JSON": json.dumps(SUBSCRIBER_SETTINGS),
                    "BENCH_SOAK_DIR": str(folder)}
        self.processes: list[subprocess.Popen[bytes]] = [self._start(n) for n in range(count)]

    def _start(self, n: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "runconsumer", "--group", "soak",
             "--group", "soak-ordered", "--group", "soak-batch",
             "--name", f"soak-{n}-{time.monotonic_ns()}", "-v", "0"],
            cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL,
            stderr=open(f"/tmp/soak-subscriber-{n}.log", "ab"),
        )

    def kill_one(self) -> None:
        from tests.history.model import Fault

        n = self.random.randrange(len(self.processes))
        victim = self.processes[n]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        at = now_ms()
        self.history.faulted(Fault("kill", at, at, runner=str(victim.pid)))
        log(f"SIGKILL subscriber {n} (pid {victim.pid}); restarting it")
        self.processes[n] = self._start(n)

    def pause_one(self, seconds: float) -> None:
        """Stop a subscriber inside a cycle transaction (tries at random moments until a
        stop catches one open; at worst a plain pause), keep it stopped, resume it."""
        from tests.history.model import Fault

        n = self.random.randrange(len(self.processes))
        victim = self.processes[n]
        began = now_ms()
        inside = False
        for _ in range(PAUSE_TRIES):
            victim.send_signal(signal.SIGSTOP)
            if transaction_left_open():
                inside = True
                break
            victim.send_signal(signal.SIGCONT)
            time.sleep(self.random.uniform(0.0, 0.2))
        else:
            victim.send_signal(signal.SIGSTOP)
        log(f"SIGSTOP subscriber {n} (pid {victim.pid}) "
            f"{'inside' if inside else 'outside'} a transaction, for {seconds:.0f}s")
        time.sleep(seconds)
        victim.send_signal(signal.SIGCONT)
        self.history.faulted(Fault("pause", began, now_ms(), runner=str(victim.pid)))

    def freeze_in_a_long_run(self, seconds: float, wait: float = 60.0) -> None:
        """SIGSTOP a subscriber while one of its long ordered runs is in flight (its
        marker file, bench/consumers.py) for ``seconds``, past its lease: another
        subscriber takes the partition and must start nothing there before the run's
        visibility timeout (issue 51). Waits up to ``wait`` seconds for such a run."""
        from tests.history.model import Fault

        deadline = time.monotonic() + wait
        live = {str(p.pid): p for p in self.processes if p.poll() is None}
        while time.monotonic() < deadline:
            running = [m for m in self.folder.glob("running-*")
                       if m.name.split("-")[1] in live]
            if running:
                break
            time.sleep(0.05)
        else:
            log("no long run in flight to freeze a subscriber in")
            return
        victim = live[running[0].name.split("-")[1]]
        began = now_ms()
        victim.send_signal(signal.SIGSTOP)
        log(f"SIGSTOP subscriber pid {victim.pid} during its long run "
            f"{running[0].name.split('-', 2)[2]}, for {seconds:.0f}s")
        time.sleep(seconds)
        victim.send_signal(signal.SIGCONT)
        self.history.faulted(Fault("pause", began, now_ms(), runner=str(victim.pid)))
        self.freezes += 1

    def restart_dead(self) -> None:
        for n, process in enumerate(self.processes):
            if process.poll() is not None:
                log(f"subscriber {n} exited with {process.returncode}; restarting it")
                self.processes[n] = self._start(n)

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


def transaction_left_open() -> bool:
    """Right after a SIGSTOP: is a transaction of this database left open with no
    statement running, for longer than any live one stays so? (InnoDB refreshes
    INNODB_TRX only after 0.1 s without readers, hence the spaced reads.)"""
    from django.db import DatabaseError, connection

    if connection.vendor == "postgresql":
        query = ("SELECT pid::text FROM pg_stat_activity WHERE state = 'idle in transaction' "
                 "AND datname = current_database() AND pid <> pg_backend_pid()")
    else:
        query = ("SELECT t.trx_id FROM information_schema.INNODB_TRX t "
                 "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                 "WHERE t.trx_query IS NULL AND t.trx_state = 'RUNNING' AND p.DB = DATABASE()")

    def idle_transactions() -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute(query)
            return {str(r[0]) for r in cursor.fetchall()}

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


# -- the producer and the staller ---------------------------------------------------------------

class Producer:
    """Publishes ``total`` messages over ``seconds`` in batches of 100: most commit at
    once, some stay open a while after their INSERT (late commits), some roll back. A
    batch whose commit's fate is unknown (the server went away) is sent again with the
    same ids: stored once."""

    def __init__(self, history: object, rng: random.Random, total: int, seconds: float,
                 late: float) -> None:
        from tests.history.model import History

        assert isinstance(history, History)
        self.history = history
        self.random = rng
        self.total = total
        self.seconds = seconds
        self.late = late
        self.committed = 0

    def run(self) -> None:
        from django.db import connections

        try:
            self._run()
        finally:
            connections.close_all()

    def _run(self) -> None:
        started = time.monotonic()
        n = 0
        while n < self.total:
            count = min(100, self.total - n)
            roll = self.random.random()
            hold = self.random.uniform(0.2, 2.0) if roll < self.late else 0.0
            self._batch(n, count, hold=hold, rollback=self.late <= roll < self.late + 0.05)
            n += count
            ahead = started + self.seconds * n / self.total - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

    def _batch(self, first: int, count: int, *, hold: float, rollback: bool) -> None:
        from django.db import DatabaseError, connection, transaction

        from sqlqueue import OutgoingMessage, send_messages
        from tests.history.model import Publish

        messages = [OutgoingMessage({"n": i}, partition_key=f"p{i % 32:02d}", id=f"soak-{i}")
                    for i in range(first, first + count)]
        begun = now_ms()
        unknown = False  # an earlier try may have committed (its COMMIT lost)
        while True:
            try:
                with transaction.atomic():
                    sent = send_messages(TOPIC, messages)
                    time.sleep(hold)
                    commit_begun = now_ms()
                    if rollback:
                        raise _RolledBack
                break
            except _RolledBack:
                ended = now_ms()
                for message, result in zip(messages, sent, strict=True):
                    self.history.published(Publish(
                        "producer", TOPIC, message.partition_key or "", str(message.id),
                        result.offset, begun, commit_begun, ended, False, result.created))
                return
            except DatabaseError as exc:
                log(f"producer: {exc.__class__.__name__}; sending the batch again")
                unknown = True
                connection.close()
                time.sleep(0.5)
        ended = now_ms()
        for message, result in zip(messages, sent, strict=True):
            # Stored by a try whose COMMIT reply was lost: this one found it stored.
            created = result.created or unknown
            self.history.published(Publish("producer", TOPIC, message.partition_key or "",
                                           str(message.id), result.offset, begun, commit_begun,
                                           ended, True, created))
        self.committed += count


class _RolledBack(Exception):
    pass


def stall_now_and_then(history: object, rng: random.Random, stop: threading.Event) -> None:
    """Another program's long transaction: every lease and delivery-state row of the topic
    locked for 0.5-3 s, every 5-15 s."""
    from django.db import DatabaseError, connection, connections, transaction

    from tests.history.model import Fault, History

    assert isinstance(history, History)
    try:
        while not stop.wait(rng.uniform(5, 15)):
            seconds = rng.uniform(0.5, 3.0)
            began = now_ms()
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute("SELECT 1 FROM queue_partition_leases WHERE topic = %s "
                                   "FOR UPDATE", [TOPIC])
                    cursor.execute("SELECT 1 FROM queue_delivery_state WHERE topic = %s "
                                   "FOR UPDATE", [TOPIC])
                    time.sleep(seconds)
            except DatabaseError:
                connection.close()
                continue
            history.faulted(Fault("stall", began, now_ms()))
    finally:
        connections.close_all()


# -- the history --------------------------------------------------------------------------------

def journal_runs() -> list[object]:
    from django.db import connection

    from tests.history.model import Run

    with connection.cursor() as cursor:
        cursor.execute("SELECT grp, partition_key, message_offset, msg_id, attempt, pid, "
                       "started_ms, finished_ms, outcome, visible_until, batch "
                       "FROM soak_journal")
        return [Run(g, TOPIC, k, int(o), i, int(a), str(p), float(s), float(f), out,
                    visible_until_ms=None if v is None else float(v), batch=b)
                for g, k, o, i, a, p, s, f, out, v, b in cursor.fetchall()]


def lease_counts(history: object) -> dict[str, int]:
    """How many lease events of each kind the history holds (renewals counted one by
    one: the history keeps a tenure's latest)."""
    from tests.history.model import History

    assert isinstance(history, History)
    counts = {"acquired": 0, "renewed": 0, "lost": 0, "released": 0}
    for event in history.leases:
        counts[event.change] += max(1, event.renewals)
    return counts


def new_history(seed: int) -> object:
    from tests.history.model import GroupConfig, History

    config = {"max_attempts": SUBSCRIBER_SETTINGS["MAX_ATTEMPTS"],
              "min_backoff_ms": round(SUBSCRIBER_SETTINGS["MIN_BACKOFF"] * 1000),
              "max_backoff_ms": round(SUBSCRIBER_SETTINGS["MAX_BACKOFF"] * 1000),
              "visibility_ms": SUBSCRIBER_SETTINGS["VISIBILITY_TIMEOUT"] * 1000}
    lease_at_risk = SUBSCRIBER_SETTINGS["LEASE_DURATION"] - SUBSCRIBER_SETTINGS[
        "LEASE_RENEW_INTERVAL"]
    return History(TOPIC, {"soak": GroupConfig(ordered=False, **config),
                           "soak-ordered": GroupConfig(ordered=True, **config),
                           "soak-batch": GroupConfig(ordered=True, **config)}, seed=seed,
                   lease_at_risk_ms=round(lease_at_risk * 1000),
                   lease_ms=SUBSCRIBER_SETTINGS["LEASE_DURATION"] * 1000,
                   renew_ms=SUBSCRIBER_SETTINGS["LEASE_RENEW_INTERVAL"] * 1000)


def with_runs(history: object) -> object:
    """``history`` with the journal's runs, read again (while the subscribers drain)."""
    from django.db import DatabaseError, connection

    from tests.history.model import History

    assert isinstance(history, History)
    try:
        history.runs = journal_runs()  # type: ignore[assignment]
    except DatabaseError:
        connection.close()
    return history


def check_file(path: Path) -> int:
    from tests.history.checker import check, report
    from tests.history.model import History

    history = History.load(path)
    violations = check(history)
    print(report(history, violations, limit=10))
    return 1 if violations else 0


# -- the run -----------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description="sqlqueue soak test")
    parser.add_argument("--database", choices=("mariadb", "postgresql"), default="mariadb",
                        help="the kind of server the soak starts for itself")
    parser.add_argument("--url", help="a server of yours instead (never restarted)")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--pauses", type=int, default=0,
                        help="subscribers stopped inside a cycle transaction")
    parser.add_argument("--pause-seconds", type=float, default=8.0)
    parser.add_argument("--freezes", type=int, default=0,
                        help="subscribers stopped (SIGSTOP, --pause-seconds, past the "
                        "lease) while one of their long ordered runs is in flight")
    parser.add_argument("--late", type=float, default=0.1,
                        help="share of batches whose transaction stays open after the INSERT")
    parser.add_argument("--no-stalls", action="store_true")
    parser.add_argument("--no-db-restart", action="store_true")
    parser.add_argument("--drain-timeout", type=float, default=600)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--history", help="write the history here (JSON)")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--check", help="only check the history in this file")
    args = parser.parse_args()
    # SIGTERM unwinds like ^C: the subscribers and the soak's own server are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(
        KeyboardInterrupt()))
    if args.check:
        sys.exit(check_file(Path(args.check)))
    if args.url:
        args.no_db_restart = True  # never restart a server the soak did not start
        sys.exit(soak(args, None, args.url))
    with own_server(args.database) as server:
        sys.exit(soak(args, server, server.url("sqlqueue_soak")))  # type: ignore[attr-defined]


def soak(args: argparse.Namespace, server: object | None, url: str) -> int:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    log(f"seed {seed} (--seed {seed} runs the same choices again); database {url}")
    rng = random.Random(seed)
    setup_soak(url)
    from tests.history.model import History

    history = new_history(seed)
    assert isinstance(history, History)
    with tempfile.TemporaryDirectory(prefix="sqlqueue-soak-events-") as folder:
        subscribers = Subscribers(args.subscribers, url, history, random.Random(rng.random()),
                                  Path(folder))
        try:
            return run_faults_and_check(args, server, history, subscribers, rng, seed)
        finally:
            subscribers.stop()


def run_faults_and_check(args: argparse.Namespace, server: object | None, history: object,
                         subscribers: Subscribers, rng: random.Random, seed: int) -> int:
    from django.db import DatabaseError, connection

    from tests.history.checker import check, report
    from tests.history.model import Fault, History
    from tests.history.workload import final_state, undone

    assert isinstance(history, History)
    seconds = args.minutes * 60
    producer = Producer(history, random.Random(rng.random()), args.messages, seconds * 0.8,
                        args.late)
    producing = threading.Thread(target=producer.run, daemon=True)
    stop_stalls = threading.Event()
    staller = None if args.no_stalls else threading.Thread(
        target=stall_now_and_then, args=(history, random.Random(rng.random()), stop_stalls),
        daemon=True)
    started = time.monotonic()
    producing.start()
    if staller is not None:
        staller.start()
    kill_times = sorted(rng.uniform(0.05, 0.95) * seconds for _ in range(args.kills))
    pause_times = sorted(rng.uniform(0.05, 0.8) * seconds for _ in range(args.pauses))
    freeze_times = sorted(rng.uniform(0.05, 0.8) * seconds for _ in range(args.freezes))
    restart_at = None if args.no_db_restart else seconds * 0.5
    restart_seconds = 0.0
    while time.monotonic() - started < seconds:
        elapsed = time.monotonic() - started
        if kill_times and elapsed >= kill_times[0]:
            kill_times.pop(0)
            subscribers.kill_one()
        if pause_times and elapsed >= pause_times[0]:
            pause_times.pop(0)
            subscribers.pause_one(args.pause_seconds)
        if freeze_times and elapsed >= freeze_times[0]:
            freeze_times.pop(0)
            subscribers.freeze_in_a_long_run(args.pause_seconds)
        if restart_at is not None and elapsed >= restart_at and server is not None:
            restart_at = None
            began = now_ms()
            log("restarting the database server")
            restart_seconds = server.restart()  # type: ignore[attr-defined]
            log(f"database back after {restart_seconds:.1f}s")
            history.faulted(Fault("outage", began, now_ms()))
            connection.close()
        subscribers.restart_dead()
        time.sleep(0.2)
    producing.join()
    stop_stalls.set()
    if staller is not None:
        staller.join()
    log(f"published {producer.committed}; waiting for the subscribers to finish")
    deadline = time.monotonic() + args.drain_timeout
    while time.monotonic() < deadline:
        try:
            if not undone(with_runs(history)):  # type: ignore[arg-type]
                break
        except DatabaseError:
            connection.close()
        subscribers.restart_dead()
        time.sleep(1)
    subscribers.stop()
    with_runs(history)
    from tests.history.lease_log import read_lines

    read_lines(sorted(subscribers.folder.glob("leases-*.jsonl")), history)
    left = undone(history)
    history.final = final_state(history)
    violations = check(history)
    summary = report(history, violations, limit=10)
    print(summary)
    if args.history:
        history.dump(Path(args.history))
        log(f"history written to {args.history}")
    result = {
        "seed": seed, "database": connection.vendor,
        "minutes": round((time.monotonic() - started) / 60, 1),
        "subscribers": args.subscribers, "published": producer.committed,
        "events_checked": history.events, "violations": len(violations),
        "not_done_in_time": len(left), "runs": len(history.runs),
        "kills": sum(f.kind == "kill" for f in history.faults),
        "pauses": sum(f.kind == "pause" for f in history.faults),
        "freezes_in_long_runs": subscribers.freezes,
        "lease_events": lease_counts(history),
        "violations_by_rule": dict(sorted(Counter(v.invariant for v in violations).items())),
        "stalls": sum(f.kind == "stall" for f in history.faults),
        "database_restarts": sum(f.kind == "outage" for f in history.faults),
        "database_restart_seconds": round(restart_seconds, 1),
        "settings": SUBSCRIBER_SETTINGS,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 1 if violations or left else 0


if __name__ == "__main__":
    main()
