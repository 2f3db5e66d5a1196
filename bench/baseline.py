"""Same-run baselines and the machine probe: what lets a reader tell a slow machine from a
slow change.

* ``machine_probe``: a fixed pure-Python loop (the CPU), an fsync'd 4 KiB write to a file
  (the disk) and an fsync'd commit of a one-row autocommit INSERT on the benchmark
  database (the disk as the server sees it, with one round trip): each the median of
  several tries, taken when the run starts.
* ``interleaved``: several ways of doing the same work, measured in small blocks taken in
  turns (the order reversed every other block), so that a drift of the machine over the
  run (the flush latency moves over minutes, the other tenants come and go) falls on
  each of them alike. Each one's rate and CPU per operation, and each block's time, so
  that a ratio can be given with its spread.
* ``FloorTable``: a table with the shape of a bare "job" row (an id, a short key, the
  payload) for the INSERT that no queue publishing through Django beats.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

#: the CPU probe: this many additions in a plain Python loop
CPU_LOOP = 3_000_000
FLOOR_TABLE = "bench_floor"


def machine_probe(tries: int = 5, commits: int = 200) -> dict[str, float]:
    """The machine as it is now: ``cpu_loop_ms`` (the loop's median time),
    ``fsync_ms`` (median of an fsync'd 4 KiB write in the temp directory), and
    ``commit_ms`` (median time of an autocommit one-row INSERT on Django's default
    database: a round trip and a flushed commit)."""
    return {"cpu_loop_ms": round(statistics.median(_cpu_loop() for _ in range(tries)), 1),
            "fsync_ms": round(_fsync_ms(max(20, tries * 10)), 3),
            "commit_ms": round(_commit_ms(commits), 3)}


def _cpu_loop() -> float:
    started = time.perf_counter()
    total = 0
    for n in range(CPU_LOOP):
        total += n & 7
    return (time.perf_counter() - started) * 1000


def _fsync_ms(count: int) -> float:
    block = os.urandom(4096)
    took = []
    with tempfile.NamedTemporaryFile(prefix="sqlqueue-probe-") as scratch:
        for _ in range(count):
            started = time.perf_counter()
            scratch.write(block)
            scratch.flush()
            os.fsync(scratch.fileno())
            took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def _commit_ms(count: int) -> float:
    from django.db import connection

    took = []
    with FloorTable() as floor, connection.cursor() as cursor:
        for n in range(count):
            started = time.perf_counter()
            cursor.execute(floor.insert_sql, ["p0", f'{{"probe": {n}}}'])
            took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


class FloorTable:
    """``bench_floor`` on Django's default database for the time of a ``with`` block:
    a BIGINT identity, a short indexed key and the payload, nothing else."""

    insert_sql = f"INSERT INTO {FLOOR_TABLE} (k, payload) VALUES (%s, %s)"

    def __enter__(self) -> FloorTable:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {FLOOR_TABLE}")
            if connection.vendor == "mysql":
                cursor.execute(f"CREATE TABLE {FLOOR_TABLE} (id BIGINT AUTO_INCREMENT PRIMARY "
                               "KEY, k VARCHAR(64) NOT NULL, payload LONGTEXT NOT NULL, "
                               "KEY (k)) ENGINE=InnoDB")
            else:
                identity = ("BIGSERIAL" if connection.vendor == "postgresql"
                            else "INTEGER")  # SQLite: an INTEGER PRIMARY KEY is the rowid
                cursor.execute(f"CREATE TABLE {FLOOR_TABLE} (id {identity} PRIMARY KEY, "
                               "k VARCHAR(64) NOT NULL, payload TEXT NOT NULL)")
                cursor.execute(f"CREATE INDEX {FLOOR_TABLE}_k ON {FLOOR_TABLE} (k)")
        return self

    def __exit__(self, *exc: object) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {FLOOR_TABLE}")


def interleaved(ways: Mapping[str, Callable[[int, int], None]], count: int,
                block: int = 25) -> dict[str, dict[str, Any]]:
    """Run each of ``ways`` ``count`` times, ``block`` at a time, in turns. A way is
    called as ``way(first, how_many)``. Returns, per way: ``per_s`` (count over the sum
    of its blocks' times), ``cpu_us`` (this process's CPU per operation) and
    ``block_s`` (every block's time, for the spread)."""
    names = list(ways)
    took: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, float] = dict.fromkeys(names, 0.0)
    for turn, first in enumerate(range(0, count, block)):
        size = min(block, count - first)
        for name in names if turn % 2 == 0 else reversed(names):
            started, cpu_started = time.perf_counter(), time.process_time()
            ways[name](first, size)
            took[name].append(time.perf_counter() - started)
            cpu[name] += time.process_time() - cpu_started
    return {name: {"per_s": round(count / sum(took[name])),
                   "cpu_us": round(cpu[name] / count * 1e6, 1),
                   "block_s": took[name]} for name in names}


def ratio(ours: Mapping[str, Any], floor: Mapping[str, Any], chunks: int = 5
          ) -> dict[str, Any]:
    """``ours`` as a share of ``floor`` (two ``interleaved`` results): over the whole run,
    and over ``chunks`` consecutive stretches of it (their lowest and highest: the
    spread a drifting machine leaves in the ratio)."""
    mine, theirs = ours["block_s"], floor["block_s"]
    size = max(1, len(mine) // chunks)
    parts = [sum(theirs[i:i + size]) / sum(mine[i:i + size])
             for i in range(0, len(mine) - size + 1, size)]
    return {"ratio": round(sum(theirs) / sum(mine), 3),
            "low": round(min(parts), 3), "high": round(max(parts), 3)}
