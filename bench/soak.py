"""Soak test: subscribers killed at random and a database restart, while a producer
publishes; then a report of what was published, handled, lost and duplicated.

    .venv/bin/python -m bench.soak --minutes 10 --messages 100000 --kills 20 --subscribers 4

Needs a local MariaDB/MySQL this user may restart (``mysqladmin shutdown``, then
``start-stop-daemon ... mariadbd``); ``--no-db-restart`` skips that part. Not part of the
test suite: it runs for minutes by design (``make soak`` runs a short one).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import reset, setup

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "bench.soak"
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
        cursor.execute("CREATE TABLE soak_journal (message_offset BIGINT NOT NULL, "
                       "pid INT NOT NULL, INDEX (message_offset))")


class Subscribers:
    def __init__(self, count: int, url: str) -> None:
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
                    "BENCH_DATABASE_URL": url, "BENCH_BATCH": "50",
                    "BENCH_SQLQUEUE_JSON": json.dumps(SUBSCRIBER_SETTINGS)}
        self.processes: list[subprocess.Popen[bytes]] = [self._start(n) for n in range(count)]
        self.kills = 0

    def _start(self, n: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "runconsumer", "--group", "soak",
             "--name", f"soak-{n}-{time.monotonic_ns()}", "-v", "0"],
            cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL,
            stderr=open(f"/tmp/soak-subscriber-{n}.log", "ab"),
        )

    def kill_one(self) -> None:
        n = random.randrange(len(self.processes))
        victim = self.processes[n]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.kills += 1
        log(f"SIGKILL subscriber {n} (pid {victim.pid}); restarting it")
        self.processes[n] = self._start(n)

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
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*), COUNT(DISTINCT message_offset) FROM soak_journal")
        rows, distinct = cursor.fetchone()
    return int(rows), int(distinct)


def main() -> None:
    parser = argparse.ArgumentParser(description="sqlqueue soak test")
    parser.add_argument("--url", default="mysql://root@127.0.0.1:3306/sqlqueue_soak")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--subscribers", type=int, default=4)
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
    restart_at = None if args.no_db_restart else seconds * 0.5
    restart_seconds = 0.0
    while time.monotonic() - started < seconds:
        elapsed = time.monotonic() - started
        if kill_times and elapsed >= kill_times[0]:
            kill_times.pop(0)
            subscribers.kill_one()
        if restart_at is not None and elapsed >= restart_at:
            restart_at = None
            restart_seconds = restart_database()
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
    with connection.cursor() as cursor:
        cursor.execute("SELECT message_offset FROM soak_journal")
        seen = {int(r[0]) for r in cursor.fetchall()}
    lost = len(set(published) - seen)
    report = {
        "minutes": round((time.monotonic() - started) / 60, 1),
        "subscribers": args.subscribers,
        "published": len(published),
        "handled": handled,
        "lost": lost,
        "duplicates": rows - handled,
        "kills": subscribers.kills,
        "database_restarts": 0 if args.no_db_restart else 1,
        "database_restart_seconds": round(restart_seconds, 1),
        "settings": SUBSCRIBER_SETTINGS,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
