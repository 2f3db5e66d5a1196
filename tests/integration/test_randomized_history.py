"""A short randomized workload on every database, its history checked for every
invariant (tests/history). Late commits, rollbacks, ids published twice, slow and
failing handlers, handlers that outlive their visibility timeout, a flood (one partition
of one group failing every message for a while), lock stalls (on a database server), two
runners sharing the partitions.

The seed is printed; ``SQLQUEUE_HISTORY_SEED=N`` runs that one again (docs/internals.md,
"The history checker"). The long run with kills and a restart is ``make soak``.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest
from django.db import connection

from sqlqueue.conf import QueueSettings
from tests.history.checker import check, report
from tests.history.workload import Shape, Workload, settings_for, undone

pytestmark = pytest.mark.django_db(transaction=True)


def seed_for_this_run() -> int:
    chosen = os.environ.get("SQLQUEUE_HISTORY_SEED")
    return int(chosen) if chosen else random.SystemRandom().randrange(1 << 31)


def shape_for_this_database() -> Shape:
    """On SQLite every write waits for the one write lock, an atomic handler's BEGIN
    IMMEDIATE included, and an atomic handler holds it for as long as it runs: one runner,
    atomic handlers that do not sleep, and a longer visibility timeout (handlers waiting
    for the lock would outlive 1 s, and rightly be delivered again, in ways the test
    cannot time)."""
    if connection.vendor == "sqlite":
        return Shape(visibility_s=3.0, runners=1, atomic_sleeps=False)
    return Shape()


def test_a_randomized_workload_keeps_every_invariant() -> None:
    seed = seed_for_this_run()
    print(f"history seed {seed} (SQLQUEUE_HISTORY_SEED={seed} runs it again)")
    workload = Workload(seed, shape_for_this_database(), settings_for(QueueSettings()))
    history = workload.run()
    assert not undone(history), f"seed {seed}: not done in time: {undone(history)[:5]}"
    violations = check(history)
    summary = report(history, violations)
    print(summary)
    if violations:
        saved = Path(tempfile.gettempdir()) / f"sqlqueue-history-{seed}.json"
        history.dump(saved)
        summary += f"\n(the history is in {saved})"
    assert violations == [], summary
    # The workload did what it is for: every kind of event happened.
    assert any(not p.committed for p in history.publishes)
    assert any(not p.created for p in history.publishes)
    assert any(r.outcome == "fail" for r in history.runs)
    flood = workload.flood  # a partition of a group failed every run for a while
    assert any((r.group, r.partition, r.outcome) == (flood.group, flood.partition, flood.kind)
               for r in history.runs), flood
    assert {r.group for r in history.runs} == set(history.groups)
    assert history.leases, "no lease event recorded"
    if connection.vendor != "sqlite":  # two runners: one froze past its lease
        assert any(f.kind == "pause" for f in history.faults)
