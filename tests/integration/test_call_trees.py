"""The tracer test of tests/unit/test_pass_is_a_tree.py on the tier's database: one
message published, passed (fetch and mark; the ack; the watermark) and handled by a
``Runner`` whose handlers run on this thread (``InlinePool``), under the call tracer.
Here every statement runs through ``storage/sql`` and ``storage/statements``: each must
cross exactly one executor and its builder of the same name (or a pair the rules list as
not mirrored yet), and the trees keep the rules they keep on the in-memory store."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from sqlqueue import send_message
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.runner import Runner
from sqlqueue.models import PartitionOffset
from sqlqueue.testing.inline import InlinePool
from tests.engine.call_rules import (
    NOT_MIRRORED_YET,
    STORAGE_CYCLES,
    cycles,
    mismatched_statements,
    storage_crossings,
    storage_cycles,
    upward_calls,
)
from tests.engine.calltrace import CallTree, traced
from tests.integration.consuming_helpers import fast_settings, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]  # the fixture


class _HandlersHere(Runner):
    pool_class = InlinePool
    pool: InlinePool


def one_message(register: Any) -> list[tuple[str, CallTree]]:
    handled: list[int] = []
    register("trace", "g", lambda message: handled.append(message.offset))
    trees = [("publish", traced(lambda: send_message("trace", 1, partition_key="p0")))]
    runner = _HandlersHere(select_consumers(["g"], ["trace"]), threads=1,
                           conf=fast_settings(WAKEUPS=False))
    try:
        for _ in range(20):
            trees.append(("pass", traced(runner.run_once)))
            if not runner.pool.work.empty():
                trees.append(("handler", traced(runner.pool.run_handed_out)))
            if handled and PartitionOffset.objects.filter(consumer_group="g",
                                                      offset_acked__gte=handled[0]).exists():
                break
    finally:
        runner.shutdown()
    assert handled, "the message was handled"
    return trees


def test_the_trees_keep_their_rules_on_the_database(register: Any) -> None:
    trees = one_message(register)
    assert storage_crossings(trees), "statements ran through storage/sql and statements"
    assert upward_calls(trees) == set()
    assert cycles(trees) == []
    # Each statement crosses its subject's executor and builder of one name, the vendor's
    # own layer standing for either (tests/engine/call_rules.py); what does not yet is
    # listed (a lone builder in the trace, which depends on the Python and Django the
    # connection opens under: none on 3.11 with Django 5.2).
    found = mismatched_statements(trees)
    known = NOT_MIRRORED_YET.get(connection.vendor, frozenset())
    assert found <= known, sorted(sorted(f) for f in found - known)
    assert storage_cycles(trees) <= STORAGE_CYCLES.get(connection.vendor, set())
