#!/usr/bin/env python
"""Where a traced latency run's time went (issue 41): read the ``trace-<pid>.jsonl`` files
a worker wrote with ``BENCH_TRACE=<dir>`` (benchjobs/trace.py) and print, for the messages
after the first tenth of the run, the stages of each one's path:

- ``ring``: enqueue time (before its commit) to the wake-up heard by the worker;
- ``towake``: that wake-up to the start of the pass that delivered it (negative: a pass
  already under way found it); ``busy``: how much of a pass was left when it was heard;
- ``cycle``: that pass's start to its commit; ``handoff``: commit to handler start;
  ``handle``: the handler itself;

then the statements per message and the delivering passes' statements, database time,
wall time and main-thread CPU time.

    python trace_report.py /tmp/trace-dir
"""
import bisect
import glob
import json
import os
import sys


def pct(values, q):
    values = sorted(v for v in values if v is not None)
    return values[int((len(values) - 1) * q)] if values else float("nan")


def load(directory):
    events = []
    for name in glob.glob(os.path.join(directory, "trace-*.jsonl")):
        with open(name) as lines:
            events += [json.loads(line) for line in lines]
    return events


def report(directory):
    events = load(directory)
    rings = sorted(e[1] for e in events if e[0] == "ring")
    cpu = {e[1]: e[3] for e in events if e[0] == "cycle" and len(e) > 3}
    cycles = sorted((e[1], e[2]) for e in events if e[0] == "cycle")
    starts = [c[0] for c in cycles]
    steady_from = cycles[len(cycles) // 10][0]
    commits = {o: e[1] for e in events if e[0] == "commit" for o in e[2]}
    ends = {e[2]: e[1] for e in events if e[0] == "end"}
    stmts = sorted((e[1], e[2], e[3]) for e in events if e[0] == "stmt" and e[1] >= steady_from)
    rows = []
    for e in events:
        if e[0] != "start" or e[3] is None or e[2] not in commits or e[3] < steady_from:
            continue
        offset, started, enqueued = e[2], e[1], e[3]
        committed = commits[offset]
        ring = rings[bisect.bisect_left(rings, enqueued)] if rings else None
        pass_start = starts[bisect.bisect_right(starts, committed) - 1]
        busy = 0.0
        if ring is not None:
            k = bisect.bisect_right(starts, ring) - 1
            if k >= 0 and cycles[k][1] > ring:
                busy = cycles[k][1] - ring
        rows.append({
            "total": ends.get(offset, started) - enqueued,
            "ring": None if ring is None else ring - enqueued,
            "towake": None if ring is None else pass_start - ring,
            "busy": busy, "cycle": committed - pass_start,
            "handoff": started - committed, "handle": ends.get(offset, started) - started,
        })
    print(f"{directory}: {len(rows)} messages (ms)")
    for key in ["total", "ring", "towake", "busy", "cycle", "handoff", "handle"]:
        values = [None if r[key] is None else r[key] * 1e3 for r in rows]
        print(f"  {key:8s} p50 {pct(values, .5):7.2f} p95 {pct(values, .95):7.2f} "
              f"p99 {pct(values, .99):7.2f} max {pct(values, 1):7.2f}")
    delivering = [e for e in events if e[0] == "commit" and e[2] and e[1] >= steady_from]
    per_pass = []
    for e in delivering:
        start, end = cycles[bisect.bisect_right(starts, e[1]) - 1]
        mine = [s for s in stmts if start <= s[0] <= end]
        per_pass.append((len(mine), sum(s[1] - s[0] for s in mine) * 1e3, (end - start) * 1e3,
                         cpu.get(start, float("nan")) * 1e3))
    messages = sum(len(e[2]) for e in delivering) or 1
    print(f"  statements per message {len(stmts) / messages:.2f}, database ms per message "
          f"{sum(s[1] - s[0] for s in stmts) * 1e3 / messages:.2f}")
    for i, name in enumerate(["statements", "database ms", "wall ms", "CPU ms"]):
        values = [p[i] for p in per_pass]
        print(f"  delivering pass {name:12s} p50 {pct(values, .5):6.2f} "
              f"p95 {pct(values, .95):6.2f} p99 {pct(values, .99):6.2f}")


if __name__ == "__main__":
    for directory in sys.argv[1:]:
        report(directory)
