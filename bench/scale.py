"""The storage side at scale (issue 52): publish, drain and garbage collection beside a
backlog of N messages nobody has consumed yet.

    .venv/bin/python -m bench.scale --url mysql://root@127.0.0.1:3306/sqlqueue_bench
    .venv/bin/python -m bench.scale --url postgres://postgres@127.0.0.1:5432/sqlqueue_bench \\
        --sizes 0,1000000,2000000 --json out.json

For each backlog size (``--sizes``, 0 first: the reference), on emptied tables:
  backlog: N messages of one topic over --partitions keys, random ids (as sqlqueue's are),
           written by one set-based INSERT ... SELECT per million rows (minutes of
           send_messages are not what is measured), with a group registered at offset 0
           (a consumer down for a night); then the tables' statistics refreshed
  publish: --messages messages to the drain benchmark's topic with send_messages in
           batches of 1,000, one transaction each
  drain:   those messages by one ``runconsumer --group bench-unordered --until-empty``
           (process start-up included, as bench.drain)
  gc:      the backlog's group moved up every partition in ``--gc-rounds`` steps (the
           last to its head), each followed by ``manage.py queue gc`` as a process: rows
           deleted a second of its own time; meanwhile live traffic (``--live-rate``
           messages a second, one ``send_message`` each, handled by a ``runconsumer`` of
           its own, bench.live_traffic): its publish-to-handled latency p50/p99 while no
           collection runs ("quiet": ``--quiet-seconds`` before each round and after the
           last) and while one runs ("gc"), the two phases interleaved so that both see
           the machine's same load; and the live topic's rows left at the end (the
           runner's own collection keeps it bounded)
Run ``--sizes 0,1000000,0,1000000`` to interleave the empty log and the backlog too: each
backlog's rates are given beside the mean of the empty runs.
Message ids (``--ids``): ``ordered`` as sqlqueue draws them (UUIDv7: time first), or
``random`` (a caller's random ids, or sqlqueue before issue 52: UUIDv4).
Prints a table (rates, and each beside the size-0 run's); a machine shared with other
work moves the wall times, not the plans (tests/integration/test_plans_at_scale.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import QUEUE_TABLES, reset, setup

ROOT = Path(__file__).resolve().parent.parent
BACKLOG_TOPIC = "bench.scale.backlog"
BACKLOG_GROUP = "bench-scale-idle"
#: ``queue gc --share`` of each round in turn (set by --gc-share: "1,0.5" alternates)
GC_SHARE = [1.0]
#: seconds to wait after each run's reset and build (set by --settle-seconds), and how
#: to settle before them (--settle: "auto" or "none")
SETTLE_SECONDS = [0.0]
SETTLE = ["auto"]
#: each round's share, rows deleted and seconds (reported with the live latencies)
ROUNDS: list[dict[str, float]] = []
#: rows of the backlog one INSERT ... SELECT writes (one transaction)
FILL_CHUNK = 1_000_000


def _numbers(vendor: str, start: int, count: int) -> str:
    """A SELECT of the integers start .. start+count-1 as ``n``, set-based (MySQL caps a
    recursive CTE at 1,000 steps: a cross join of digits there and on SQLite)."""
    if vendor == "postgresql":
        return f"SELECT n FROM generate_series({start}, {start + count - 1}) AS g(n)"
    if vendor == "mariadb":  # the SEQUENCE engine: no temporary table (in a shared /tmp)
        return f"SELECT seq AS n FROM seq_{start}_to_{start + count - 1}"
    digits = "SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {d}" for d in range(1, 10))
    places = len(str(count - 1))
    joins = " CROSS JOIN ".join(f"({digits}) p{k}" for k in range(places))
    value = " + ".join(f"p{k}.d * {10 ** k}" for k in range(places))
    return f"SELECT {start} + {value} AS n FROM {joins} WHERE {value} < {count}"


def build_backlog(size: int, partitions: int, ids: str = "ordered") -> None:
    """``size`` messages of BACKLOG_TOPIC, and BACKLOG_GROUP at offset 0 on each of its
    partitions."""
    from django.db import connection

    vendor = connection.vendor
    sequence_vendor = "mariadb" if getattr(connection, "mysql_is_mariadb", False) else vendor
    q = connection.ops.quote_name
    pad = "x" * 80
    if vendor == "postgresql":
        key, ident = f"'k' || (n % {partitions})", "md5(n::text)"
        ordered = "lpad(to_hex(n), 32, '0')"
        payload = f"convert_to('{{\"n\": ' || n || ', \"pad\": \"{pad}\"}}', 'UTF8')"
    elif vendor == "mysql":
        key, ident = f"CONCAT('k', n % {partitions})", "MD5(n)"
        ordered = "LPAD(HEX(n), 32, '0')"
        payload = f"CONCAT('{{\"n\": ', n, ', \"pad\": \"{pad}\"}}')"
    else:
        key, ident = f"'k' || (n % {partitions})", "lower(hex(randomblob(16)))"
        ordered = "printf('%032x', n)"
        payload = f"CAST('{{\"n\": ' || n || ', \"pad\": \"{pad}\"}}' AS BLOB)"
    if ids == "ordered":  # in offset order, as UUIDv7s drawn one after another are
        ident = ordered
    with connection.cursor() as cursor:
        for start in range(0, size, FILL_CHUNK):
            count = min(FILL_CHUNK, size - start)
            cursor.execute(
                "INSERT INTO queue_messages (topic, partition_key, id, payload, metadata, "
                "created_at, published_at, failed_at, failure_count, last_error, "
                "original_topic, priority, deliver_after, consumer_group) "
                f"SELECT '{BACKLOG_TOPIC}', {key}, {ident}, {payload}, NULL, 1700000000000, "
                f"1700000000000, 0, 0, '', '', 50, 0, '' "
                f"FROM ({_numbers(sequence_vendor, start, count)}) s ORDER BY n")
        cursor.execute(
            "INSERT INTO queue_offsets (consumer_group, topic, partition_key, offset_acked, "
            f"updated_at, first_pending) SELECT DISTINCT '{BACKLOG_GROUP}', topic, "
            f"partition_key, 0, 0, {'NULL' if vendor == 'mysql' else 'CAST(NULL AS BIGINT)'} "
            "FROM queue_messages "
            f"WHERE topic = '{BACKLOG_TOPIC}'")
        for table in ("queue_messages", "queue_offsets"):
            if vendor == "mysql":
                cursor.execute(f"ANALYZE TABLE {q(table)}")
                cursor.fetchall()
            else:
                cursor.execute(f"ANALYZE {q(table)}")


def publish(messages: int) -> float:
    """send_messages in batches of 1,000 to the drain benchmark's topic; msg/s."""
    from django.db import transaction

    from bench.consumers import TOPIC
    from sqlqueue import OutgoingMessage, send_messages

    started = time.perf_counter()
    for first in range(0, messages, 1000):
        with transaction.atomic():
            send_messages(TOPIC, [OutgoingMessage({"n": n}, partition_key=f"p{n % 16}")
                                  for n in range(first, min(first + 1000, messages))])
    return messages / (time.perf_counter() - started)


def _manage(url: str, *args: str) -> str:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
           "BENCH_DATABASE_URL": url}
    done = subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout


def drain(url: str, messages: int) -> float:
    """runconsumer --until-empty of the group that handles the published messages; msg/s."""
    started = time.perf_counter()
    _manage(url, "runconsumer", "--group", "bench-unordered", "--until-empty", "-v", "0")
    return messages / (time.perf_counter() - started)


def collect(url: str, live_rate: float = 0, quiet_seconds: float = 20, rounds: int = 1,
            ) -> tuple[int, float, dict[str, Any]]:
    """The idle group moved up its partitions in ``rounds`` steps, each followed by
    ``queue gc``: (rows deleted, seconds, the live traffic's latencies by phase: {}
    without). With live traffic the phases interleave: quiet, gc, quiet, gc, ..., quiet,
    each quiet ``quiet_seconds`` long, so that both phases see the same load."""
    from django.db import connection

    from bench.consumers import LIVE_TOPIC
    from bench.live_traffic import LiveTraffic
    from sqlqueue.models import QueueMessage

    spans = _backlog_spans()
    ROUNDS.clear()
    if live_rate <= 0:
        return (*_collect_rounds(url, spans, rounds, None, 0), {})
    with LiveTraffic(url, live_rate) as live:
        deleted, seconds = _collect_rounds(url, spans, rounds, live, quiet_seconds)
        live.mark("quiet")
        time.sleep(quiet_seconds)
    latencies: dict[str, Any] = live.summary()
    latencies["live_rows_left"] = QueueMessage.objects.filter(topic=LIVE_TOPIC).count()
    latencies["live_sent"] = len(live.publish_ms)
    latencies["rounds"] = list(ROUNDS)
    connection.close()
    return deleted, seconds, latencies


def _collect_rounds(url: str, spans: dict[str, tuple[int, int]], rounds: int,
                    live: Any, quiet_seconds: float) -> tuple[int, float]:
    deleted, seconds = 0, 0.0
    for step in range(1, rounds + 1):
        share = GC_SHARE[(step - 1) % len(GC_SHARE)]
        if live is not None:
            live.mark("quiet")
            time.sleep(quiet_seconds)
        _finish_backlog(spans, step, rounds)
        # Several shares: each its own phase ("gc 0.5"), the first one's is "gc".
        rows, took = _collect(url, share, live,
                              "gc" if share == GC_SHARE[0] else f"gc {share:g}")
        deleted, seconds = deleted + rows, seconds + took
        ROUNDS.append({"share": share, "rows": rows, "s": took})
    return deleted, seconds


def _backlog_spans() -> dict[str, tuple[int, int]]:
    """Per partition of the backlog: its first and last offsets."""
    from django.db import connection

    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT partition_key, MIN({q('offset')}), MAX({q('offset')}) FROM queue_messages "
            f"WHERE topic = '{BACKLOG_TOPIC}' GROUP BY partition_key")
        return {key: (int(low), int(high)) for key, low, high in cursor.fetchall()}


def _finish_backlog(spans: dict[str, tuple[int, int]], step: int, rounds: int) -> None:
    """The idle group's watermark on each partition ``step / rounds`` of the way up."""
    from django.db import connection

    if not spans:
        return
    with connection.cursor() as cursor:
        cursor.executemany(
            "UPDATE queue_offsets SET offset_acked = %s WHERE consumer_group = %s "
            "AND topic = %s AND partition_key = %s",
            [(high if step == rounds else low - 1 + (high - low + 1) * step // rounds,
              BACKLOG_GROUP, BACKLOG_TOPIC, key)
             for key, (low, high) in spans.items()])


def _collect(url: str, share: float, live: Any = None, phase: str = "gc",
             ) -> tuple[int, float]:
    """``queue gc`` as a process. With ``live``: its start-up (Django's, before the first
    DELETE) is the phase "start-up", what follows its first progress line ``phase``."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
           "BENCH_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    if live is not None:
        live.mark("start-up")
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "queue", "gc", "--share", str(share)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE)
    assert process.stdout is not None
    chunks: list[bytes] = []
    while chunk := os.read(process.stdout.fileno(), 4096):
        if live is not None and not any(b"so far" in c for c in chunks) and b"so far" in chunk:
            live.mark(phase)  # the first batch is done: deleting
        chunks.append(chunk)
    if process.wait():
        raise SystemExit(f"queue gc exited with {process.returncode}")
    out = b"".join(chunks).decode()
    # The command's own time (without the process's start-up): "..., in 71.8 s."
    found = re.search(r"Deleted (\d+) message.*, in ([\d.]+) s", out)
    if found is None:
        raise SystemExit(f"queue gc said: {out!r}")
    return int(found.group(1)), float(found.group(2))


def settle() -> None:
    """Bring the tables to the state a backlog grown over hours is in, then wait for the
    server to be idle: a log read seconds after one statement wrote a million rows pays
    for that statement (PostgreSQL sets the rows' hint bits on first read, dirtying every
    page, while its autovacuum and a WAL checkpoint run beside the measurement: 0.5x
    in some runs). ``--settle auto`` (the default): PostgreSQL vacuums and analyzes the
    queue tables and checkpoints; MySQL/MariaDB analyzes them and waits until InnoDB's
    purge is done; then, on either, ``--settle-seconds`` more. ``--settle none``: only
    the seconds."""
    from django.db import connection

    if SETTLE[0] == "auto":
        tables = [connection.ops.quote_name(table) for table in QUEUE_TABLES]
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"VACUUM (ANALYZE) {', '.join(tables)}")
                cursor.execute("CHECKPOINT")
            elif connection.vendor == "mysql":
                cursor.execute(f"ANALYZE TABLE {', '.join(tables)}")
                cursor.fetchall()
                wait_for_purge(cursor)
    time.sleep(SETTLE_SECONDS[0])


def wait_for_purge(cursor: Any, limit: float = 300) -> None:
    """Until InnoDB's history list (undo of committed changes not purged yet) is short."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        cursor.execute("SELECT `COUNT` FROM information_schema.INNODB_METRICS "
                       "WHERE NAME = 'trx_rseg_history_len'")
        found = cursor.fetchone()
        if found is None or found[0] < 1000:
            return
        time.sleep(1)


def run_size(url: str, size: int, partitions: int, messages: int, ids: str = "ordered",
             live_rate: float = 0, quiet_seconds: float = 20, rounds: int = 1,
             ) -> dict[str, Any]:
    reset()
    started = time.perf_counter()
    build_backlog(size, partitions, ids)
    built = time.perf_counter() - started
    # The database's own work after a bulk write (PostgreSQL's checkpoint of the WAL a
    # million rows wrote, its autovacuum of the new rows; InnoDB's flushing) would be
    # measured as the backlog's cost: settled, after every run's reset or build alike.
    settle()
    result: dict[str, Any] = {"backlog": size, "build_s": round(built, 1),
                              "publish_msg_s": round(publish(messages)),
                              "drain_msg_s": round(drain(url, messages))}
    deleted, seconds, live = collect(url, live_rate if size else 0, quiet_seconds,
                                     rounds if size else 1)
    # The command gives its time to a tenth of a second: no rate below that.
    result.update(gc_rows=deleted, gc_s=round(seconds, 1),
                  gc_rows_s=round(deleted / seconds) if seconds >= 0.1 else None,
                  live=live, load=round(os.getloadavg()[0], 1))
    reset()
    return result


def table(results: list[dict[str, Any]]) -> str:
    """Each backlog's rates beside the mean of the runs on an empty log (run between them:
    ``--sizes 0,1000000,0,1000000``), or the first run when none was empty."""
    empty = [r for r in results if not r["backlog"]] or results[:1]
    base = {key: sum(r[key] for r in empty) / len(empty)
            for key in ("publish_msg_s", "drain_msg_s")}
    lines = ["| backlog | publish msg/s (vs 0) | drain msg/s (vs 0) | gc rows | gc s | gc rows/s "
             "| live p50 / p99 ms, quiet | live p50 / p99 ms, during gc | p99 gc / quiet "
             "| live rows left | load |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        publish_ratio = r["publish_msg_s"] / base["publish_msg_s"]
        drain_ratio = r["drain_msg_s"] / base["drain_msg_s"]
        live = r.get("live") or {}

        def phase(name: str, live: dict[str, Any] = live) -> str:
            got = live.get(name)
            return f"{got['p50_ms']} / {got['p99_ms']}" if got else "-"
        quiet, during = live.get("quiet"), live.get("gc")
        ratio = (f"{during['p99_ms'] / quiet['p99_ms']:.2f}x"
                 if quiet and during and quiet["p99_ms"] else "-")
        lines.append(
            f"| {r['backlog']:,} | {r['publish_msg_s']:,} ({publish_ratio:.2f}x) "
            f"| {r['drain_msg_s']:,} ({drain_ratio:.2f}x) "
            f"| {r['gc_rows']:,} | {r['gc_s']} "
            f"| {'-' if r['gc_rows_s'] is None else format(r['gc_rows_s'], ',')} "
            f"| {phase('quiet')} | {phase('gc')} | {ratio} | {live.get('live_rows_left', '-')} "
            f"| {r.get('load', '-')} |")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: str, title: str) -> None:
    """The curves: publish, drain and gc rates against the backlog's size (log scale
    across, 0 drawn at the left), and the live traffic's p99 while gc runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [max(r["backlog"], 1) for r in results]
    figure, (rates, latency) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, label in (("publish_msg_s", "publish msg/s"), ("drain_msg_s", "drain msg/s"),
                       ("gc_rows_s", "gc rows/s")):
        points = [(x, r[key]) for x, r in zip(sizes, results, strict=True) if r.get(key)]
        rates.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    rates.set_xscale("symlog", linthresh=1)
    rates.set_yscale("log")
    rates.set_xlabel("backlog (messages)")
    rates.set_title(f"{title}: rates beside a backlog")
    rates.legend()
    for phase in ("quiet", "gc"):
        points = [(x, r["live"][phase]["p99_ms"]) for x, r in zip(sizes, results, strict=True)
                  if (r.get("live") or {}).get(phase)]
        latency.plot([x for x, _ in points], [y for _, y in points], marker="o",
                     label=f"live p99, {phase}")
    latency.set_xscale("symlog", linthresh=1)
    latency.set_xlabel("backlog (messages)")
    latency.set_ylabel("ms")
    latency.set_title("publish-to-handled p99 (ms)")
    latency.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description="sqlqueue at scale: publish, drain, gc")
    parser.add_argument("--url", default=os.environ.get(
        "BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench"))
    parser.add_argument("--sizes", default="0,1000000",
                        help="backlog sizes, comma-separated (the first is the reference)")
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--messages", type=int, default=20_000,
                        help="messages published and drained beside the backlog")
    parser.add_argument("--ids", choices=("ordered", "random"), default="ordered",
                        help="the backlog's message ids: as sqlqueue draws them (UUIDv7, "
                             "ordered) or random (a caller's, or UUIDv4)")
    parser.add_argument("--live-rate", type=float, default=50,
                        help="live messages a second while the backlog is collected (0: none)")
    parser.add_argument("--quiet-seconds", type=float, default=20,
                        help="live traffic measured before and after the collection")
    parser.add_argument("--gc-rounds", type=int, default=4,
                        help="the backlog finished and collected in this many steps, "
                             "each between two quiet phases of live traffic")
    parser.add_argument("--gc-share", default="1.0",
                        help="queue gc --share: the part of its time it deletes; several, "
                             "comma-separated (1,0.5): each round the next, interleaved, "
                             "the live latency of each in its own phase (\"gc 0.5\")")
    parser.add_argument("--settle", choices=("auto", "none"), default="auto",
                        help="after each run's reset and build, bring the tables to a "
                             "steady state (auto: PostgreSQL VACUUM ANALYZE and "
                             "CHECKPOINT; MySQL ANALYZE and InnoDB's purge) or not")
    parser.add_argument("--settle-seconds", type=float, default=0,
                        help="then wait this long")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--plot", help="also draw the curves to this PNG (matplotlib)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    GC_SHARE[:] = [float(share) for share in args.gc_share.split(",")]
    SETTLE_SECONDS[0] = args.settle_seconds
    SETTLE[0] = args.settle
    setup(args.url)
    from django.db import connection

    results = []
    for size in sizes:
        results.append(run_size(args.url, size, args.partitions, args.messages, args.ids,
                                args.live_rate, args.quiet_seconds, args.gc_rounds))
        print(json.dumps(results[-1]), flush=True)
    print(f"\n{connection.vendor}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if args.plot:
        plot(results, args.plot, connection.vendor)


if __name__ == "__main__":
    main()
