"""Batch drain (issue 55): a no-op batch consumer (``max_batch=500``) against the
single-message consumer and Dramatiq + Redis, in the same run, in interleaved rounds.

    .venv/bin/python -m bench.batch_drain                          # MariaDB, 100,000 msgs
    .venv/bin/python -m bench.batch_drain --url postgres://postgres@127.0.0.1:5432/bench
    .venv/bin/python -m bench.batch_drain --messages 20000 --rounds 1   # a quick look

Each round drains the same number of pre-loaded messages with 2 worker processes for each
contender in turn (A B C A B C ...): ``sqlqueue_batch`` (2 x ``runconsumer``, the batch
group), ``sqlqueue`` (2 x ``runconsumer``, a single-message consumer) and ``dramatiq``
(``dramatiq --processes 2``, Redis). It goes through the peer harness (bench/peers, the
``drain`` scenario, its own virtualenv), so every contender's job records its completion
the same way (a Redis RPUSH: one per job, one per batch for the batch consumer), and the
rate is taken from the first to the last completion (start-up left out).

Besides the rate: the CPU per message of the workers (their processes and children) and of
the server that holds the queue (mysqld; on PostgreSQL the backends of the bench database;
Redis for Dramatiq), so that the comparison holds on a faster or a slower machine. The
median round of each is reported, with every round's figure beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

CONTENDERS = ("sqlqueue_batch", "sqlqueue", "dramatiq")
#: the server process(es) whose CPU is the queue's: by database, for the sqlqueue ones
SERVER_KEY = {"mysql": "mariadb_cpu_s", "postgresql": "postgresql_cpu_s"}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {text}", file=sys.stderr, flush=True)


def per_message(record: dict[str, Any], vendor: str, peer: str) -> dict[str, Any]:
    """One drain's figures per message: rate, worker and server CPU (ms)."""
    done = max(1, int(record.get("completed") or 0))
    server_key = "redis_cpu_s" if peer == "dramatiq" else SERVER_KEY[vendor]
    server = record.get(server_key)
    return {
        "messages_per_s": record.get("jobs_per_s"),
        "worker_cpu_ms_per_message": record.get("worker_cpu_ms_per_job"),
        "server": server_key.removesuffix("_cpu_s"),
        "server_cpu_ms_per_message": None if server is None else round(
            server * 1000 / done, 4),
        "completed": record.get("completed"), "timed_out": record.get("timed_out"),
        "duplicates": record.get("duplicates"), "error": record.get("error"),
    }


def median(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] if ordered else None


def summary(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians by contender, and the ratios the issue's targets are read from."""
    out: dict[str, Any] = {}
    for peer, records in rounds.items():
        row: dict[str, Any] = {}
        for key in ("messages_per_s", "worker_cpu_ms_per_message",
                    "server_cpu_ms_per_message"):
            values = [r[key] for r in records if r.get(key) is not None]
            row[key] = median(values)
            row[f"{key}_rounds"] = [r.get(key) for r in records]
        row["server"] = records[0]["server"] if records else None
        out[peer] = row

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else round(a / b, 2)

    batch, single, dramatiq = (out.get(p, {}) for p in CONTENDERS)
    out["ratios"] = {
        "batch_vs_single_rate": ratio(batch.get("messages_per_s"),
                                      single.get("messages_per_s")),
        "batch_vs_dramatiq_rate": ratio(batch.get("messages_per_s"),
                                        dramatiq.get("messages_per_s")),
        "single_vs_dramatiq_worker_cpu": ratio(single.get("worker_cpu_ms_per_message"),
                                               dramatiq.get("worker_cpu_ms_per_message")),
        "batch_vs_dramatiq_worker_cpu": ratio(batch.get("worker_cpu_ms_per_message"),
                                              dramatiq.get("worker_cpu_ms_per_message")),
    }
    return out


def run(url: str, messages: int, rounds: int, processes: int, timeout: int,
        contenders: tuple[str, ...] = CONTENDERS) -> dict[str, Any]:
    """Interleaved rounds on the database of ``url`` (MariaDB/MySQL or PostgreSQL)."""
    from bench.publish import ensure_database
    from bench.suite import peer_environment, peer_step, peers_python

    vendor = "postgresql" if url.startswith(("postgres", "pgsql")) else "mysql"
    python = peers_python()
    env = peer_environment(url)
    ensure_database(url)
    for peer in contenders:
        log(f"{peer}: setup")
        peer_step(python, env, 300, "setup", "--peer", peer)
    found: dict[str, list[dict[str, Any]]] = {peer: [] for peer in contenders}
    raw: dict[str, list[dict[str, Any]]] = {peer: [] for peer in contenders}
    for round_ in range(rounds):
        for peer in contenders:
            log(f"{peer}: drain {messages:,} with {processes} processes "
                f"(round {round_ + 1} of {rounds})")
            record = peer_step(python, env, timeout + 300, "drain", "--peer", peer,
                               "--n", str(messages), "--workers", str(processes),
                               "--poll", "default", "--timeout", str(timeout))
            raw[peer].append(record)
            found[peer].append(per_message(record, vendor, peer))
            log(f"{peer}: {json.dumps(found[peer][-1])}")
    return {"database": vendor, "messages": messages, "processes": processes,
            "rounds": rounds, "summary": summary(found), "raw": raw}


def main() -> None:
    parser = argparse.ArgumentParser(description="sqlqueue batch drain vs single vs Dramatiq")
    parser.add_argument("--url", default=os.environ.get(
        "BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench"))
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=240)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    args = parser.parse_args()
    contenders = tuple(c for c in args.contenders.split(",") if c)
    print(json.dumps(run(args.url, args.messages, args.rounds, args.processes, args.timeout,
                         contenders), indent=2))


if __name__ == "__main__":
    main()
