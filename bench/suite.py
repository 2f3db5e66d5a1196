"""The benchmark suite: every scenario in one command, side by side with the peers, written
as a results table (Markdown and JSON) and plots (PNG).

    python -m bench.suite                  # about 12 minutes on 2 cores
    python -m bench.suite --quick          # small sizes, sqlqueue and django-tasks-db only
    python -m bench.suite --no-peers       # sqlqueue's own scenarios only
    python -m bench.suite --databases postgresql   # the PostgreSQL section only

Results go to ``bench/results/`` (``--out``): ``results.json``, ``results.md`` and
``*.png``, with the machine, versions and database settings. The peers (django-tasks-db,
django-q2, Celery + Redis, Dramatiq + Redis) run through the harness in ``bench/peers``,
in their own virtualenv ``.venv-peers`` (created on first use), on the same MariaDB and
Redis; sqlqueue runs there too through its adapter, so the peer table compares like with
like. A second section runs on PostgreSQL (``--pg-url``): sqlqueue's publishing, and the
peers that live there (django-tasks-db, Procrastinate) beside sqlqueue. With the peers,
each section ends with the batch drain (``bench.batch_drain``: a batch consumer, the
single-message one and Dramatiq in interleaved rounds) and its targets. See
bench/README.md for what each scenario measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.batch_report import batch_markdown

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / "bench" / "peers"
PEERS_VENV = ROOT / ".venv-peers"
#: no queue: one INSERT through Django's cursor per transaction, which only takes its turn
#: in "enqueue one per transaction": no Django-based queue publishes faster, so its rate
#: bounds the ratio of any two of them on the machine of the run
REFERENCE = "django_insert"
ALL_PEERS = ("tasks_db", "django_q2", "celery", "dramatiq", "sqlqueue", REFERENCE)
#: the peers that run on PostgreSQL (Procrastinate runs nowhere else)
PG_PEERS = ("tasks_db", "procrastinate", "sqlqueue", REFERENCE)
QUICK_PEERS = ("tasks_db", "sqlqueue", REFERENCE)


@dataclass(frozen=True)
class Sizes:
    single: int
    bulk: int
    drain: int
    statements: int
    peer_single: int
    peer_bulk: int
    peer_drain: int
    peer_drain_timeout: int
    latency_seconds: int
    split_partitions: int
    split_subscribers: int
    rounds: int
    batch_drain: int


FULL = Sizes(single=2000, bulk=50_000, drain=20_000, statements=2000, peer_single=2000,
             peer_bulk=20_000, peer_drain=5000, peer_drain_timeout=60, latency_seconds=15,
             split_partitions=1000, split_subscribers=10, rounds=3,
             batch_drain=100_000)
QUICK = Sizes(single=300, bulk=5000, drain=3000, statements=1000, peer_single=300,
              peer_bulk=2000, peer_drain=1000, peer_drain_timeout=20, latency_seconds=5,
              split_partitions=200, split_subscribers=4, rounds=1,
              batch_drain=5000)
#: shorter leases than the defaults (30 s, renewed every 10 s), as a busy deployment may set
FAST_LEASES = {"LEASE_DURATION": 8, "LEASE_RENEW_INTERVAL": 2}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {text}", file=sys.stderr, flush=True)


# -- sqlqueue's own scenarios (this virtualenv) -----------------------------------------------
def run_module(module: str, *args: str) -> dict[str, Any]:
    """``python -m bench.<module>``: each scenario in a fresh process, its JSON back."""
    out = subprocess.run([sys.executable, "-m", f"bench.{module}", *args], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout[out.stdout.index("{"):])


def own_scenarios(sizes: Sizes, url: str, quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {}
    log("publish: one per transaction, and send_messages in batches of 1,000")
    results["publish"] = run_module("publish", "--url", url, "--single", str(sizes.single),
                                    "--bulk", str(sizes.bulk), "--batch", "1000",
                                    "--rounds", str(sizes.rounds))
    drains = [("bench-unordered", 1, 100), ("bench-unordered", 2, 100),
              ("bench-unordered", 1, 10), ("bench-unordered", 2, 10),
              ("bench-ordered", 1, 100), ("bench-ordered", 2, 100)]
    results["drain"] = []
    for group, processes, batch in drains[:3] if quick else drains:
        log(f"drain: {sizes.drain} messages, {group}, {processes} process(es), batch {batch}"
            f" ({sizes.rounds} round(s))")
        results["drain"].append(median_round([run_module(
            "drain", "--url", url, "--messages", str(sizes.drain), "--group", group,
            "--processes", str(processes), "--batch", str(batch))
            for _ in range(sizes.rounds)], "messages_per_s"))
    log("statements per message (drain at batch 100) and per idle poll")
    results["statements"] = run_module("statements", "--url", url,
                                       "--messages", str(sizes.statements))
    log("polling cost as the table grows; discovery cost with many partitions")
    results["costs"] = run_module("costs", "--url", url, *(["--quick"] if quick else []))
    results["lease_split"] = []
    for settings in ([FAST_LEASES] if quick else [{}, FAST_LEASES]):
        log(f"lease split: {sizes.split_partitions} partitions, {sizes.split_subscribers} "
            f"processes, settings {settings or 'default'}")
        results["lease_split"].append(run_module(
            "lease_split", "--url", url, "--partitions", str(sizes.split_partitions),
            "--subscribers", str(sizes.split_subscribers), "--settings", json.dumps(settings)))
    return results


# -- the peers (their own virtualenv, the harness in bench/peers) ------------------------------
def peers_python() -> Path:
    """The peers' virtualenv: made on first use, brought up to date when
    bench/peers/requirements.txt changed since (a new peer, a new version)."""
    python = PEERS_VENV / "bin" / "python"
    requirements = (PEERS_DIR / "requirements.txt").read_text()
    installed = PEERS_VENV / "requirements.installed"
    if not python.exists():
        log(f"creating {PEERS_VENV} for the peers (once)")
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    if not installed.exists() or installed.read_text() != requirements:
        log(f"installing the peers' requirements into {PEERS_VENV}")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r",
                        str(PEERS_DIR / "requirements.txt"), "-e",
                        f"{ROOT}[mysql,postgresql,redis]"], check=True)
        installed.write_text(requirements)
    return python


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` on the same server."""
    return urlsplit(url)._replace(path=f"/{name}").geturl()


def peer_environment(url: str) -> dict[str, str]:
    import environ

    db = environ.Env.db_url_config(url)
    postgresql = db["ENGINE"].endswith("postgresql")
    return {**os.environ, "DB_ENGINE": "postgresql" if postgresql else "mysql",
            "DB_HOST": db["HOST"] or "127.0.0.1",
            "DB_PORT": str(db["PORT"] or (5432 if postgresql else 3306)),
            "DB_USER": db["USER"] or ("postgres" if postgresql else "root"),
            "DB_PASSWORD": db["PASSWORD"] or "", "DB_NAME": db["NAME"]}


def peer_step(python: Path, env: dict[str, str], limit: int, *args: str) -> dict[str, Any]:
    """One harness scenario (``run.py``), bounded; its JSON line, or an error record."""
    try:
        out = subprocess.run([str(python), "run.py", *args], cwd=PEERS_DIR, env=env,
                             capture_output=True, text=True, timeout=limit)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if lines:
            return dict(json.loads(lines[-1]))
        return {"ok": False, "error": out.stderr.strip().splitlines()[-1:] or "no output"}
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"killed after {limit}s"}
    finally:
        subprocess.run([str(python), "run.py", "cleanup"], cwd=PEERS_DIR, env=env,
                       capture_output=True)


def peer_scenarios(sizes: Sizes, url: str, peers: list[str],
                   only_enqueue: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Every harness scenario for ``peers`` on the database of ``url`` (created if
    missing: MariaDB/MySQL or PostgreSQL); the peers in ``only_enqueue`` (and
    ``REFERENCE``, which is no queue) run only the one-message enqueue."""
    from bench.publish import ensure_database

    only_enqueue = only_enqueue | {REFERENCE}
    python = peers_python()
    env = peer_environment(url)
    ensure_database(url)
    results: dict[str, Any] = {}
    for peer in peers:
        log(f"peer {peer}: setup")
        peer_step(python, env, 300, "setup", "--peer", peer)
        results[peer] = {"info": peer_step(python, env, 120, "info", "--peer", peer)}
    # One commit per message makes this scenario a measure of the disk's fsync, whose
    # latency drifts over minutes: the peers take turns, and each one's median round
    # is reported.
    singles: dict[str, list[dict[str, Any]]] = {peer: [] for peer in peers}
    for round_ in range(sizes.rounds):
        for peer in peers:
            log(f"peer {peer}: enqueue one per transaction (round {round_ + 1})")
            singles[peer].append(peer_step(python, env, 300, "enqueue_single", "--peer", peer,
                                           "--n", str(sizes.peer_single)))
    for peer in peers:
        row = results[peer]
        row["enqueue_single"] = median_round(singles[peer], "msgs_per_s")
        if peer in only_enqueue:
            continue
        log(f"peer {peer}: enqueue in bulk")
        row["enqueue_bulk"] = peer_step(python, env, 300, "enqueue_bulk", "--peer", peer,
                                        "--n", str(sizes.peer_bulk), "--batch", "1000")
        for workers in (1, 2):
            log(f"peer {peer}: drain with {workers} process(es)")
            row[f"drain_{workers}"] = peer_step(
                python, env, sizes.peer_drain_timeout + 120, "drain", "--peer", peer,
                "--n", str(sizes.peer_drain), "--workers", str(workers), "--poll", "default",
                "--timeout", str(sizes.peer_drain_timeout))
        log(f"peer {peer}: latency at 100/s")
        row["latency"] = peer_step(python, env, sizes.latency_seconds + 120, "latency",
                                   "--peer", peer, "--workers", "1", "--poll", "default",
                                   "--rate", "100", "--duration", str(sizes.latency_seconds))
    return results


def median_round(rounds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The round with the median ``key`` (the lower middle one of an even count), with
    every round's figure beside it."""
    measured = sorted((r for r in rounds if r.get(key) is not None), key=lambda r: r[key])
    chosen = dict(measured[(len(measured) - 1) // 2]) if measured else dict(rounds[-1])
    chosen["rounds"] = [r.get(key) for r in rounds]
    return chosen


# -- the report ------------------------------------------------------------------------------
def machine(url: str) -> dict[str, Any]:
    """The machine, the versions, and the settings of ``url``'s server that bound the
    figures (read with the driver: one process reports on two servers)."""
    import django

    vendor, variables = "sqlite", {}
    if url.startswith("mysql"):
        vendor, variables = "mysql", _mysql_settings(url)
    elif url.startswith(("postgres", "pgsql")):
        vendor, variables = "postgresql", _postgresql_settings(url)
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "django": django.get_version(),
            "database": vendor, "database_settings": variables}


def _mysql_settings(url: str) -> dict[str, Any]:
    import MySQLdb

    parts = urlsplit(url)
    server = MySQLdb.connect(host=parts.hostname or "127.0.0.1", port=parts.port or 3306,
                             user=parts.username or "root", passwd=parts.password or "")
    try:
        cursor = server.cursor()
        cursor.execute("SHOW VARIABLES WHERE Variable_name IN ('version', "
                       "'innodb_flush_log_at_trx_commit', 'innodb_buffer_pool_size', "
                       "'sync_binlog', 'transaction_isolation', 'tx_isolation')")
        return dict(cursor.fetchall())
    finally:
        server.close()


def _postgresql_settings(url: str) -> dict[str, Any]:
    import psycopg

    parts = urlsplit(url)
    with psycopg.connect(host=parts.hostname or "127.0.0.1", port=parts.port or 5432,
                         user=parts.username or "postgres", password=parts.password or None,
                         dbname="postgres") as server:
        return dict(server.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', "
            "'synchronous_commit', 'fsync', 'shared_buffers', 'wal_level', "
            "'default_transaction_isolation')").fetchall())


def rate(record: dict[str, Any], key: str) -> str:
    value = record.get(key)
    if record.get("na"):
        return "n/a"
    if value is None:
        return "error" if record.get("error") or record.get("ok") is False else "-"
    suffix = " (timed out)" if record.get("timed_out") else ""
    return f"{value:,.0f}{suffix}"


def seconds(value: float | None) -> str:
    return "not within the limit" if value is None else f"{value:.1f} s"


def report(results: dict[str, Any]) -> str:
    """results.md: the MariaDB/MySQL sections and the PostgreSQL one, those that ran."""
    text = markdown(results) if "sqlqueue" in results else (
        f"# Benchmark results\n\nRun {results['started']} "
        f"({'quick' if results['quick'] else 'full'} mode), {results['seconds']:.0f} s.\n")
    if "postgresql" in results:
        text += "\n".join(postgresql_markdown(results["postgresql"],
                                              results["sizes"]["rounds"])) + "\n"
    return text


def markdown(results: dict[str, Any]) -> str:
    own = results["sqlqueue"]
    lines = ["# Benchmark results", "",
             f"Run {results['started']} ({'quick' if results['quick'] else 'full'} mode), "
             f"{results['seconds']:.0f} s. Machine: {results['machine']['cpus']} CPUs, "
             f"{results['machine']['platform']}; Python {results['machine']['python']}, "
             f"Django {results['machine']['django']}; "
             f"{results['machine']['database']} {results['machine']['database_settings']}.",
             "", "## sqlqueue", "",
             f"Publish and drain figures: the median of {results['sizes']['rounds']} "
             "round(s).", "", probe_line(own["publish"]), "",
             "| scenario | result |", "|---|---:|",
             *publish_rows(own["publish"]),
             f"| publish in bulk (`send_messages`, batches of 1,000) | "
             f"{own['publish']['bulk_per_s']:,} msg/s |",
             f"| publish in bulk from {own['publish']['bulk_parallel_processes']} processes "
             f"at once (aggregate) | {own['publish']['bulk_parallel_per_s']:,} msg/s |"]
    for d in own["drain"]:
        lines.append(f"| drain {d['messages']:,}, {d['group']}, {d['processes']} process(es), "
                     f"batch {d['batch']} (start-up included) | {d['messages_per_s']:,} msg/s |")
    st = own["statements"]
    lines += [f"| SQL statements per message, steady drain at batch 100 | "
              f"{st['per_message']:.3f} |",
              f"| SQL statements per idle poll | {st['per_idle_poll']:.2f} |"]
    costs = own["costs"]
    for key, ratio in costs["poll_ratio"].items():
        lines.append(f"| {key} ratio, {' vs '.join(costs['poll'])} | {ratio} |")
    for label, ms in costs["discovery_ms"].items():
        lines.append(f"| partition discovery, {label} | {ms} ms |")
    for split in own.get("lease_split", []):
        leases = (f"leases {split['lease_duration_s']:g} s renewed every "
                  f"{split['lease_renew_interval_s']:g} s")
        lines += [
            f"| {split['partitions']:,} partitions, {split['subscribers']} processes "
            f"({leases}): fair split, from start | {seconds(split['fair_split_s'])} |",
            f"| same: fair again after one process stops (SIGTERM) | "
            f"{seconds(split['one_left_fair_again_s'])} |"]
    if results.get("peers"):
        lines += ["", "## Side by side (the peer harness, same run, same MariaDB and Redis)", ""]
        lines += peer_table(results["peers"], results["sizes"]["rounds"])
    lines += batch_markdown(results.get("batch_drain"))
    lines += ["", "## Targets (issue 6), from this run", ""]
    lines += target_table(targets(results))
    return "\n".join(lines) + "\n"


def probe_line(publish: dict[str, Any]) -> str:
    """The machine probe taken as the publish scenario started (``bench.baseline``)."""
    probe = publish.get("probe")
    if not probe:
        return ""
    return (f"Machine probe at the start: a fixed Python loop {probe['cpu_loop_ms']:.0f} ms, "
            f"an fsync'd 4 KiB write {probe['fsync_ms']:.2f} ms, an autocommit one-row "
            f"INSERT {probe['commit_ms']:.2f} ms (medians). A slower machine shows here "
            "first; the ratios below are to floors measured in the same run, blocks in "
            "turns.")


def publish_rows(publish: dict[str, Any]) -> list[str]:
    """The one-message publish rows: in ``atomic()`` and in autocommit, each with its
    share of the bare INSERT of the same payload (the floor, same run, in turns)."""
    ways, versus = publish.get("single_ways"), publish.get("single_vs_floor")
    if not ways or not versus:
        return [f"| publish, one message per transaction | {publish['single_per_s']:,} "
                "msg/s |"]
    rows = []
    for mode, label in (("atomic", "in its own `atomic()`"),
                        ("autocommit", "outside any transaction (autocommit)")):
        ours, floor, share = (ways[f"publish_{mode}"], ways[f"insert_{mode}"],
                              versus[mode])
        rows.append(f"| publish one message {label}: vs a bare INSERT of the same payload "
                    f"through Django's cursor ({floor['per_s']:,} msg/s, "
                    f"{floor['cpu_us']:.0f} µs CPU) | {ours['per_s']:,} msg/s, "
                    f"{ours['cpu_us']:.0f} µs CPU: **{share['ratio']:.0%}** of it "
                    f"(stretches {share['low']:.0%}-{share['high']:.0%}) |")
    return rows


def peer_table(peers: dict[str, Any], rounds: int) -> list[str]:
    lines = ["| peer | enqueue 1/txn msg/s | bulk msg/s | drain 1 proc jobs/s | "
             "drain 2 procs jobs/s | latency p50 / p95 / p99 / max ms |",
             "|---|---:|---:|---:|---:|---:|"]
    for peer, row in peers.items():
        if "latency" not in row:  # the one-message enqueue only (a quick run)
            lines.append(f"| {peer} | {rate(row['enqueue_single'], 'msgs_per_s')} | "
                         "| | | |")
            continue
        latency = row["latency"]
        lat = ("error" if latency.get("lat_ms_p50") is None else
               f"{latency['lat_ms_p50']:.0f} / {latency['lat_ms_p95']:.0f} / "
               f"{latency['lat_ms_p99']:.0f} / {latency.get('lat_ms_max') or 0:.0f}")
        lines.append(f"| {peer} | {rate(row['enqueue_single'], 'msgs_per_s')} | "
                     f"{rate(row['enqueue_bulk'], 'msgs_per_s')} | "
                     f"{rate(row['drain_1'], 'jobs_per_s')} | "
                     f"{rate(row['drain_2'], 'jobs_per_s')} | {lat} |")
    lines += ["", f"Enqueue one per transaction: the median of {rounds} interleaved "
              "round(s) per peer; the other peer figures are single runs."]
    return lines + reference_lines(peers)


def reference_lines(peers: dict[str, Any]) -> list[str]:
    """What ``REFERENCE`` (no queue) says of the one-message enqueue: each queue's rate as
    a share of it, and the most "sqlqueue vs django-tasks-db" could be on this machine."""
    floor = (peers.get(REFERENCE) or {}).get("enqueue_single", {}).get("msgs_per_s")
    if not floor:
        return []
    shares = [f"{peer} {row['enqueue_single']['msgs_per_s'] / floor:.0%}"
              for peer, row in peers.items()
              if peer != REFERENCE and row.get("enqueue_single", {}).get("msgs_per_s")]
    lines = ["", f"{REFERENCE} is no queue: one INSERT through Django's cursor in each "
             "transaction, what every Django-based queue's one-message publish pays at "
             f"least. Each peer's rate as a share of its {floor:,.0f} msg/s: "
             f"{', '.join(shares)}."]
    tasks_db = (peers.get("tasks_db") or {}).get("enqueue_single", {}).get("msgs_per_s")
    if tasks_db:
        lines[-1] += (f" A queue publishing as fast as it would be {floor / tasks_db:.2f}x "
                      "django-tasks-db.")
    return lines


def target_table(found: list[tuple[str, str, str, bool]]) -> list[str]:
    return ["| target | wanted | measured | met |", "|---|---|---|:-:|"] + [
        f"| {name} | {wanted} | {got} | {'yes' if ok else 'no'} |"
        for name, wanted, got, ok in found]


def postgresql_markdown(section: dict[str, Any], rounds: int) -> list[str]:
    """The PostgreSQL section of results.md."""
    if section.get("skipped"):
        return ["", "## PostgreSQL", "", f"Not run: {section['skipped']}."]
    server = section["machine"]
    publish = section["publish"]
    lines = ["", "## PostgreSQL", "",
             f"{server['database']} {server['database_settings']}.", "",
             probe_line(publish), "",
             f"sqlqueue's publishing (`bench.publish`, the median of {rounds} round(s)):", "",
             "| scenario | result |", "|---|---:|",
             *publish_rows(publish),
             f"| publish in bulk (`send_messages`, batches of 1,000: COPY) | "
             f"{publish['bulk_per_s']:,} msg/s |",
             f"| publish in bulk from {publish['bulk_parallel_processes']} processes at once "
             f"(aggregate) | {publish['bulk_parallel_per_s']:,} msg/s |"]
    if section.get("peers"):
        lines += ["", "Side by side (the peer harness, same PostgreSQL and Redis):", ""]
        lines += peer_table(section["peers"], rounds)
        lines += batch_markdown(section.get("batch_drain"))
    lines += ["", "## Targets on PostgreSQL (issue 20), from this run", ""]
    return lines + target_table(postgresql_targets(section))


def floor_targets(publish: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """Issue 41's publish targets: the one-message publish as a share of the bare INSERT
    of the same payload through Django's cursor, measured in the same run."""
    versus = publish.get("single_vs_floor") or {}
    found = []
    for mode, label, wanted in (("autocommit", "outside a transaction", 0.90),
                                ("atomic", "in atomic()", 0.95)):
        if mode in versus:
            share = versus[mode]
            found.append((f"one-message publish {label} vs a bare Django INSERT, same run",
                          f">= {wanted:.0%}", f"{share['ratio']:.0%} (stretches "
                          f"{share['low']:.0%}-{share['high']:.0%})",
                          share["ratio"] >= wanted))
    return found


def postgresql_targets(section: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(target, wanted, measured, met) for issue 20's targets this run can judge."""
    peers = section.get("peers") or {}

    def figure(peer: str, key: str, field: str) -> float | None:
        value = (peers.get(peer) or {}).get(key, {}).get(field)
        return float(value) if value else None

    found = floor_targets(section["publish"])
    ours, theirs = (figure("sqlqueue", "enqueue_single", "msgs_per_s"),
                    figure("tasks_db", "enqueue_single", "msgs_per_s"))
    if ours and theirs:
        found.append(("one-message publish vs django-tasks-db", ">= 1.5x",
                      f"{ours / theirs:.2f}x ({ours:,.0f} vs {theirs:,.0f} msg/s)",
                      ours >= 1.5 * theirs))
    ours, theirs = (figure("sqlqueue", "drain_2", "jobs_per_s"),
                    figure("procrastinate", "drain_2", "jobs_per_s"))
    if ours and theirs:
        found.append(("drain, 2 processes, vs Procrastinate", ">= 5x",
                      f"{ours / theirs:.2f}x ({ours:,.0f} vs {theirs:,.0f} jobs/s)",
                      ours >= 5 * theirs))
    p99 = figure("sqlqueue", "latency", "lat_ms_p99")
    if p99 is not None:
        found.append(("publish-to-start latency p99 at 100 msg/s, default settings",
                      "<= 25 ms", f"{p99:.0f} ms", p99 <= 25))
    return found


def postgresql_section(sizes: Sizes, url: str, peers: list[str] | None,
                       quick: bool = False) -> dict[str, Any]:
    """sqlqueue's publishing on PostgreSQL and, unless ``peers`` is None, the harness's
    scenarios for ``peers`` there (database ``<name>_peers`` beside ``url``'s)."""
    reason = postgresql_unreachable(url)
    if reason:
        log(f"PostgreSQL section skipped: {reason}")
        return {"skipped": reason}
    section: dict[str, Any] = {"machine": machine(url)}
    log("PostgreSQL: publish, one per transaction, and send_messages in batches of 1,000")
    section["publish"] = run_module("publish", "--url", url, "--single", str(sizes.single),
                                    "--bulk", str(sizes.bulk), "--batch", "1000",
                                    "--rounds", str(sizes.rounds))
    if peers is not None:
        name = urlsplit(url).path.lstrip("/")
        # Quick: the peers other than sqlqueue only enqueue (the ratio target); their
        # drains, which time out at this size, would double the run.
        others = frozenset(p for p in peers if p != "sqlqueue") if quick else frozenset()
        section["peers"] = peer_scenarios(sizes, with_database(url, f"{name}_peers"), peers,
                                          only_enqueue=others)
        section["batch_drain"] = batch_drain(sizes, url)
    return section


def batch_drain(sizes: Sizes, url: str) -> dict[str, Any]:
    """The batch consumer against the single-message one and Dramatiq, interleaved
    (``bench.batch_drain``, database ``<name>_batch`` beside ``url``'s)."""
    log(f"batch drain: {sizes.batch_drain:,} messages, batch vs single vs Dramatiq "
        f"({sizes.rounds} round(s))")
    return run_module("batch_drain", "--url",
                      with_database(url, f"{urlsplit(url).path.lstrip('/')}_batch"),
                      "--messages", str(sizes.batch_drain), "--rounds", str(sizes.rounds))


def postgresql_unreachable(url: str) -> str | None:
    """Why the PostgreSQL server of ``url`` cannot be used, or None."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (the postgresql extra)"
    parts = urlsplit(url)
    try:
        psycopg.connect(host=parts.hostname or "127.0.0.1", port=parts.port or 5432,
                        user=parts.username or "postgres", password=parts.password or None,
                        dbname="postgres", connect_timeout=5).close()
    except psycopg.Error as error:
        return f"no PostgreSQL server at {parts.hostname}:{parts.port or 5432} ({error})"
    return None


def targets(results: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(target, wanted, measured, met) for each target this run can judge."""
    own, peers = results["sqlqueue"], results.get("peers") or {}
    found: list[tuple[str, str, str, bool]] = []

    def peer_rate(peer: str, key: str, field: str) -> float | None:
        value = (peers.get(peer) or {}).get(key, {}).get(field)
        return float(value) if value else None

    ours, theirs = (peer_rate("sqlqueue", "enqueue_single", "msgs_per_s"),
                    peer_rate("tasks_db", "enqueue_single", "msgs_per_s"))
    if ours and theirs:
        found.append(("one-message publish vs django-tasks-db", ">= 1.5x",
                      f"{ours / theirs:.2f}x", ours >= 1.5 * theirs))
    found += floor_targets(own["publish"])
    bulk = own["publish"]["bulk_per_s"]
    found.append(("bulk publish (send_messages, 1,000 per batch), one process",
                  ">= 50,000 msg/s", f"{bulk:,} msg/s", bulk >= 50_000))
    parallel = own["publish"]["bulk_parallel_per_s"]
    found.append((f"the same from {own['publish']['bulk_parallel_processes']} processes "
                  "(not the target; for reference)", ">= 50,000 msg/s", f"{parallel:,} msg/s",
                  parallel >= 50_000))
    ours = peer_rate("sqlqueue", "drain_2", "jobs_per_s")
    for peer, factor in (("tasks_db", 10.0), ("celery", 1.0), ("dramatiq", 1.0)):
        theirs = peer_rate(peer, "drain_2", "jobs_per_s")
        if ours and theirs:
            found.append((f"drain, 2 processes, vs {peer}",
                          f">= {factor:g}x" + (" (aim)" if peer == "dramatiq" else ""),
                          f"{ours / theirs:.2f}x", ours >= factor * theirs))
    p99 = (peers.get("sqlqueue") or {}).get("latency", {}).get("lat_ms_p99")
    if p99 is not None:
        found.append(("latency p99 at 100 msg/s, default settings", "<= 150 ms",
                      f"{p99:.0f} ms", p99 <= 150))
    per_message = own["statements"]["per_message"]
    found.append(("statements per message at batch 100", "<= 0.1", f"{per_message:.3f}",
                  per_message <= 0.1))
    for key, ratio in own["costs"]["poll_ratio"].items():
        found.append((f"{key}, {' vs '.join(own['costs']['poll'])}", "<= 1.5", f"{ratio}",
                      ratio <= 1.5))
    return found


def plots(results: dict[str, Any], out: Path) -> list[str]:
    """Bar charts of the peer table (matplotlib: the ``bench`` extra)."""
    peers = results.get("peers") or {}
    if not peers:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for key, field, title, name in (
        ("enqueue_single", "msgs_per_s", "Publish, one message per transaction (msg/s)",
         "publish.png"),
        ("drain_2", "jobs_per_s", "Drain with 2 worker processes (jobs/s)", "drain.png"),
    ):
        names = list(peers)
        values = [peers[p][key].get(field) or 0 for p in names]
        figure, axes = plt.subplots(figsize=(7, 3.5))
        axes.bar(names, values, color=["#417690" if p == "sqlqueue" else "#999"
                                       for p in names])
        axes.set_title(title)
        axes.set_yscale("log" if max(values, default=1) > 20 * max(min(values), 1)
                        else "linear")
        figure.tight_layout()
        figure.savefig(out / name, dpi=100)
        plt.close(figure)
        written.append(name)
    figure, axes = plt.subplots(figsize=(7, 3.5))
    for offset, q in enumerate(("p50", "p95", "p99")):
        values = [peers[p]["latency"].get(f"lat_ms_{q}") or 0 for p in peers]
        axes.bar([i + offset * 0.27 for i in range(len(peers))], values, width=0.27,
                 label=q)
    axes.set_xticks([i + 0.27 for i in range(len(peers))], list(peers))
    axes.set_title("Latency at 100 msg/s, default settings (ms)")
    axes.set_yscale("log")
    axes.legend()
    figure.tight_layout()
    figure.savefig(out / "latency.png", dpi=100)
    plt.close(figure)
    written.append("latency.png")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # The databases (the peers' are <name>_peers beside them) may come from the
    # environment, so that a test or a shared machine can point the suite elsewhere.
    parser.add_argument("--url", default=os.environ.get(
        "BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench"))
    parser.add_argument("--pg-url", default=os.environ.get(
        "BENCH_PG_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/sqlqueue_bench"))
    parser.add_argument("--databases", default="mysql,postgresql",
                        help="the sections to run: mysql, postgresql or both")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--peers", default=None,
                        help=f"comma-separated, from {', '.join(ALL_PEERS + PG_PEERS[1:2])} "
                        f"({REFERENCE}: no queue, the reference for one INSERT per "
                        "transaction)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    sections = set(args.databases.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "quick": args.quick, "sizes": sizes.__dict__}
    chosen = args.peers.split(",") if args.peers else None
    if "mysql" in sections:
        results["sqlqueue"] = own_scenarios(sizes, args.url, args.quick)
        if not args.no_peers:
            default: tuple[str, ...] = QUICK_PEERS if args.quick else ALL_PEERS
            results["peers"] = peer_scenarios(
                sizes, with_database(args.url, f"{urlsplit(args.url).path.lstrip('/')}_peers"),
                [p for p in chosen or default if p in ALL_PEERS])
            results["batch_drain"] = batch_drain(sizes, args.url)
        results["machine"] = machine(args.url)
    if "postgresql" in sections:
        default = QUICK_PEERS if args.quick else PG_PEERS
        results["postgresql"] = postgresql_section(
            sizes, args.pg_url,
            None if args.no_peers else [p for p in chosen or default if p in PG_PEERS],
            quick=args.quick)
    results["seconds"] = time.monotonic() - started
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(report(results))
    written = plots(results, out)
    log(f"wrote {out / 'results.md'}, results.json and {', '.join(written) or 'no plots'} "
        f"in {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
