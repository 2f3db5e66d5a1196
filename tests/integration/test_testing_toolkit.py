"""sqlqueue.testing (issue 38): consumers and tasks run inside the test's own transaction.

Every case runs twice: in a ``django.test.TestCase`` (one transaction around the test: a
second connection would wait on its locks or not see its rows) and in a
``TransactionTestCase`` (autocommit, rows committed as they are written).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.test import TestCase, TransactionTestCase
from django.test.utils import CaptureQueriesContext, override_settings

import sqlqueue
from sqlqueue.consuming.registry import unregister
from sqlqueue.database_names import configured_name
from sqlqueue.models import DeadLetter, PartitionLease
from sqlqueue.testing import (
    NotATestDatabase,
    RunReport,
    advance_clock,
    capture_messages,
    clock_offset_ms,
    inline,
    reset_clock,
    run_consumers,
)
from sqlqueue.wakeups import Doorbell
from tests.settings import HAS_TASKS
from tests.testapp.models import Order

TOPIC = "toolkit.orders"

#: (handler name, payload, attempt) of every call, in order
calls: list[tuple[str, Any, int]] = []


def charge(message: sqlqueue.Message) -> None:
    calls.append(("charge", message.payload, message.attempt))
    instructions = message.payload
    if instructions.get("reject"):
        raise sqlqueue.Reject("refused by the payload")
    if message.attempt <= instructions.get("fail_times", 0):
        raise RuntimeError(f"failing attempt {message.attempt}")
    Order.objects.create(reference=f"charged:{instructions['ref']}")


def charge_atomic(message: sqlqueue.Message) -> None:
    calls.append(("charge_atomic", message.payload, message.attempt))
    Order.objects.create(reference=f"atomic:{message.payload['ref']}:{message.attempt}")
    if message.attempt <= message.payload.get("fail_times", 0):
        raise RuntimeError("after writing: the write must go with the failure")


def keep_order(message: sqlqueue.Message) -> None:
    calls.append(("keep_order", message.payload, message.attempt))
    if message.attempt <= message.payload.get("fail_times", 0):
        raise RuntimeError("holds the partition")


async def charge_async(message: sqlqueue.Message) -> None:
    calls.append(("charge_async", message.payload, message.attempt))
    await Order.objects.acreate(reference=f"async:{message.payload['ref']}")


def duplicate_write(message: sqlqueue.Message) -> None:
    """A handler whose database write fails (a unique key): the test's transaction must
    stay usable (on PostgreSQL every later statement would fail otherwise)."""
    calls.append(("duplicate_write", message.payload, message.attempt))
    Order.objects.create(reference="taken")


def publish_next(message: sqlqueue.Message) -> None:
    calls.append(("publish_next", message.payload, message.attempt))
    topic = message.payload.get("to", TOPIC)
    sqlqueue.send_message(topic, {"ref": f"next-{message.payload['ref']}"},
                          partition_key="chained")


def take_long(message: sqlqueue.Message) -> None:
    """A long handler that extends its visibility: inside a TestCase the write must not go
    through a second connection, which would wait on the test's locks."""
    calls.append(("take_long", message.payload, message.attempt))
    message.extend_visibility(120)


HANDLERS = [
    (TOPIC, "billing", charge, {"max_attempts": 3}),
    ("toolkit.atomic", "ledger", charge_atomic, {"atomic": True}),
    ("toolkit.ordered", "sequencer", keep_order, {"ordered": True}),
    ("toolkit.async", "asyncgroup", charge_async, {}),
    ("toolkit.duplicate", "dupes", duplicate_write, {"max_attempts": 2}),
    ("toolkit.chain", "chainers", publish_next, {}),
    ("toolkit.long", "patient", take_long, {}),
    ("toolkit.long", "patient-atomic", take_long, {"atomic": True}),
]


@contextlib.contextmanager
def counted_waits() -> Iterator[list[float]]:
    """The seconds of every wait on a runner's doorbell and every ``time.sleep`` inside
    the block (each still waits): a run that polls or waits for handlers shows here,
    however fast or slow the machine."""
    waits: list[float] = []
    real_wait, real_sleep = Doorbell.wait, time.sleep

    def wait(bell: Doorbell, timeout: float) -> bool:
        waits.append(timeout)
        return real_wait(bell, timeout)

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        real_sleep(seconds)

    with mock.patch.object(Doorbell, "wait", wait), mock.patch("time.sleep", sleep):
        yield waits


class ToolkitCases:
    """The cases, for both kinds of Django test case."""

    assertEqual: Any
    assertTrue: Any
    assertLess: Any
    addCleanup: Any

    def setUp(self) -> None:
        calls.clear()
        for topic, group, handler, options in HANDLERS:
            sqlqueue.consumer(topic, group=group, **options)(handler)
            self.addCleanup(unregister, group, topic)
        self.addCleanup(reset_clock)

    def place_order(self, ref: str, **instructions: Any) -> None:
        with transaction.atomic():
            Order.objects.create(reference=ref)
            sqlqueue.send_message(TOPIC, {"ref": ref, **instructions}, partition_key="c-1",
                                  metadata={"trace": ref})

    def test_a_published_message_is_captured_and_handled(self) -> None:
        with capture_messages(topic=TOPIC) as sent:
            self.place_order("o-1")
        self.assertEqual([(m.topic, m.partition_key, m.payload, m.metadata) for m in sent],
                         [(TOPIC, "c-1", {"ref": "o-1"}, {"trace": "o-1"})])
        self.assertTrue(sent[0].offset > 0 and sent[0].id)

        report = run_consumers(group="billing")

        self.assertEqual(report, RunReport(acked=1, retried=0, dead_lettered=0))
        self.assertTrue(Order.objects.filter(reference="charged:o-1").exists())
        self.assertEqual(run_consumers(group="billing"), RunReport())  # nothing left

    def test_a_capture_sees_only_its_block_and_topic(self) -> None:
        self.place_order("before")
        with capture_messages() as everything, capture_messages(topic="toolkit.other") as other:
            sqlqueue.send_message("toolkit.other", {"n": 1})
            self.assertEqual(len(everything), 1)  # live inside the block
            self.place_order("inside")
            try:
                with transaction.atomic():
                    sqlqueue.send_message("toolkit.other", {"n": "rolled back"})
                    raise ZeroDivisionError
            except ZeroDivisionError:
                pass
        self.place_order("after")
        self.assertEqual([m.payload for m in everything], [{"n": 1}, {"ref": "inside"}])
        self.assertEqual(other.payloads, [{"n": 1}])

    def test_a_publish_absorbed_by_its_id_is_not_captured(self) -> None:
        first = sqlqueue.send_message(TOPIC, {"ref": "once"}, id="order-1", priority=7)
        with capture_messages(topic=TOPIC) as sent:
            again = sqlqueue.send_message(TOPIC, {"ref": "once"}, id="order-1")
        self.assertEqual((again.created, again.offset, sent), (False, first.offset, []))
        with capture_messages() as sent:
            sqlqueue.send_message(TOPIC, {"ref": "twice"}, id="order-2", priority=7)
        self.assertEqual((sent[0].id, sent[0].priority, sent[0].created),
                         ("order-2", 7, True))

    def test_a_failing_handler_is_reported_with_its_exception_and_traceback(self) -> None:
        self.place_order("e-1", fail_times=1)
        self.place_order("e-2", reject=True)  # Reject (and Retry) are answers, not errors

        report = run_consumers(group="billing")

        self.assertEqual(report, RunReport(retried=1, dead_lettered=1))
        self.assertEqual(len(report.errors), 1)
        failure = report.errors[0]
        self.assertEqual((type(failure.exception), str(failure.exception)),
                         (RuntimeError, "failing attempt 1"))
        self.assertEqual((failure.message.payload["ref"], failure.message.attempt,
                          failure.message.consumer_group, failure.message.topic),
                         ("e-1", 1, "billing", TOPIC))
        # Where it was raised, as Python prints it: the handler's own line.
        self.assertTrue(failure.traceback.startswith("Traceback (most recent call last):"))
        self.assertTrue('in charge\n    raise RuntimeError(f"failing attempt {message.attempt}")'
                        in failure.traceback, failure.traceback)
        self.assertTrue(failure.traceback.endswith("RuntimeError: failing attempt 1\n"))
        # What a failed assertEqual on the report prints names it.
        self.assertTrue(f"{TOPIC}/c-1@" in repr(report), repr(report))
        self.assertTrue("RuntimeError('failing attempt 1')" in repr(report), repr(report))
        advance_clock(5)
        self.assertEqual(run_consumers(group="billing").errors, ())  # its retry succeeded

    def test_raise_errors_raises_the_first_after_recording_the_run(self) -> None:
        self.place_order("r-1", fail_times=1)
        self.place_order("r-2", fail_times=1)
        self.place_order("r-3")

        with self.assertRaises(RuntimeError) as raised:
            run_consumers(group="billing", raise_errors=True)

        self.assertEqual(str(raised.exception), "failing attempt 1")
        self.assertTrue(any(f"on {TOPIC}/c-1@" in note and "'billing', attempt 1" in note
                            for note in raised.exception.__notes__), raised.exception.__notes__)
        # Stopped at the first failure: the others were handed out, not started.
        self.assertEqual([(p["ref"], attempt) for _, p, attempt in calls], [("r-1", 1)])
        # The run was recorded and closed: r-1 waits for its retry, the leases were given
        # back, the others are delivered by the next run (their first attempt).
        self.assertEqual(list(PartitionLease.objects.exclude(consumer_group="")), [])
        report = run_consumers(group="billing")
        self.assertEqual(report, RunReport(acked=1, retried=1))
        self.assertEqual([(p["ref"], attempt) for _, p, attempt in calls[1:]],
                         [("r-2", 1), ("r-3", 1)])
        advance_clock(5)
        self.assertEqual(run_consumers(group="billing", raise_errors=True),
                         RunReport(acked=2))
        self.assertEqual(Order.objects.filter(reference__startswith="charged:").count(), 3)

    def test_raise_errors_in_an_atomic_handler_leaves_nothing_of_it(self) -> None:
        sqlqueue.send_message("toolkit.atomic", {"ref": "ra", "fail_times": 1})
        with self.assertRaises(RuntimeError):
            run_consumers(group="ledger", raise_errors=True)
        self.assertEqual(list(Order.objects.filter(reference__startswith="atomic:")), [])
        advance_clock(5)
        self.assertEqual(run_consumers(group="ledger", raise_errors=True), RunReport(acked=1))

    def test_a_paused_group_is_left_alone(self) -> None:
        from sqlqueue.operations.flow import pause, resume

        self.place_order("paused")
        pause("billing")
        self.assertEqual(run_consumers(group="billing"), RunReport())
        resume("billing")
        self.assertEqual(run_consumers(group="billing"), RunReport(acked=1))

    def test_a_retry_waits_for_its_backoff_until_the_clock_moves(self) -> None:
        self.place_order("o-2", fail_times=1)

        self.assertEqual(run_consumers(group="billing"), RunReport(retried=1))
        self.assertEqual(run_consumers(group="billing"), RunReport())  # backing off (1 s+)
        advance_clock(2)  # MIN_BACKOFF 1 s plus up to 33 % jitter
        self.assertEqual(run_consumers(group="billing"), RunReport(acked=1))

        self.assertEqual([attempt for _, _, attempt in calls], [1, 2])
        self.assertTrue(Order.objects.filter(reference="charged:o-2").exists())

    def test_a_message_failing_every_attempt_is_dead_lettered(self) -> None:
        self.place_order("o-3", fail_times=99)
        reports = [run_consumers(group="billing")]
        for _ in range(3):
            advance_clock(3600)  # past any backoff
            reports.append(run_consumers(group="billing"))

        self.assertEqual(reports, [RunReport(retried=1), RunReport(retried=1),
                                   RunReport(dead_lettered=1), RunReport()])
        dead = DeadLetter.objects.get(consumer_group="billing")
        self.assertEqual((dead.original_topic, dead.failure_count), (TOPIC, 3))
        self.assertTrue("failing attempt 3" in dead.last_error)

    def test_a_rejected_message_is_dead_lettered_at_once(self) -> None:
        self.place_order("o-4", reject=True)
        self.assertEqual(run_consumers(group="billing"), RunReport(dead_lettered=1))

    def test_an_ordered_partition_is_held_by_its_failing_head(self) -> None:
        for n in range(3):
            sqlqueue.send_message("toolkit.ordered", {"n": n, "fail_times": 1 if n == 0 else 0},
                                  partition_key="p")

        self.assertEqual(run_consumers(group="sequencer"), RunReport(retried=1))
        with advance_clock(60):
            self.assertEqual(run_consumers(group="sequencer"), RunReport(acked=3))

        self.assertEqual([(payload["n"], attempt) for _, payload, attempt in calls],
                         [(0, 1), (0, 2), (1, 1), (2, 1)])

    def test_an_atomic_handler_commits_its_writes_with_the_ack(self) -> None:
        sqlqueue.send_message("toolkit.atomic", {"ref": "a", "fail_times": 1})

        self.assertEqual(run_consumers(group="ledger"), RunReport(retried=1))
        self.assertEqual(list(Order.objects.filter(reference__startswith="atomic:")), [])
        advance_clock(5)
        self.assertEqual(run_consumers(group="ledger"), RunReport(acked=1))

        self.assertEqual([o.reference for o in Order.objects.filter(
            reference__startswith="atomic:")], ["atomic:a:2"])
        advance_clock(3600)  # past any visibility timeout: acked, never delivered again
        self.assertEqual(run_consumers(group="ledger"), RunReport())

    def test_an_async_handler_is_awaited_on_the_same_connection(self) -> None:
        sqlqueue.send_message("toolkit.async", {"ref": "x"})
        self.assertEqual(run_consumers(group="asyncgroup"), RunReport(acked=1))
        self.assertTrue(Order.objects.filter(reference="async:x").exists())

    def test_a_handlers_database_error_leaves_the_test_transaction_usable(self) -> None:
        Order.objects.create(reference="taken")
        sqlqueue.send_message("toolkit.duplicate", {"ref": "d"})

        self.assertEqual(run_consumers(group="dupes"), RunReport(retried=1))
        advance_clock(5)
        self.assertEqual(run_consumers(group="dupes"), RunReport(dead_lettered=1))

        self.assertEqual(Order.objects.filter(reference="taken").count(), 1)
        self.assertTrue(IntegrityError.__name__ in DeadLetter.objects.get().last_error)

    def test_a_handler_may_extend_its_visibility(self) -> None:
        sqlqueue.send_message("toolkit.long", {"ref": "long"})
        self.assertEqual(run_consumers(topic="toolkit.long"), RunReport(acked=2))

    def test_a_scheduled_message_waits_for_the_clock(self) -> None:
        sqlqueue.send_message(TOPIC, {"ref": "later"}, delay=600)
        self.assertEqual(run_consumers(group="billing"), RunReport())
        advance_clock(601)
        self.assertEqual(run_consumers(group="billing"), RunReport(acked=1))

    def test_max_messages_bounds_the_run(self) -> None:
        for n in range(3):
            self.place_order(f"m-{n}")
        self.assertEqual(run_consumers(group="billing", max_messages=2), RunReport(acked=2))
        self.assertEqual(run_consumers(topic=TOPIC), RunReport(acked=1))

    def test_what_a_handler_publishes_is_run_in_the_same_call(self) -> None:
        sqlqueue.send_message("toolkit.chain", {"ref": "first"})
        with capture_messages(topic=TOPIC) as chained:
            report = run_consumers()
        self.assertEqual(report, RunReport(acked=2))
        self.assertEqual(chained.payloads, [{"ref": "next-first"}])
        self.assertTrue(Order.objects.filter(reference="charged:next-first").exists())

    def test_an_unknown_group_is_an_error(self) -> None:
        try:
            run_consumers(group="nosuch")
        except sqlqueue.ConfigurationError as exc:
            self.assertTrue("nosuch" in str(exc) and "billing" in str(exc))
        else:
            raise AssertionError("run_consumers(group='nosuch') did not raise")

    def test_a_run_never_waits(self) -> None:
        # The point of the toolkit: no polling interval, no thread to wait for. Counted,
        # not timed: a regression to polling waits on the runner's doorbell or sleeps.
        self.place_order("fast")
        with counted_waits() as waits:
            self.assertEqual(run_consumers(group="billing"), RunReport(acked=1))
        self.assertEqual(waits, [])

    if HAS_TASKS:
        def test_a_task_runs_and_its_result_is_read_back(self) -> None:
            from tests.testapp import tasks

            with transaction.atomic():
                result = tasks.add.enqueue(2, 3)
            report = run_consumers(group="tasks")

            self.assertEqual(report, RunReport(acked=1))
            result.refresh()
            self.assertEqual((result.status.name, result.return_value), ("SUCCESSFUL", 5))

        def test_a_failing_task_ends_failed_after_its_attempts(self) -> None:
            from tests.testapp import tasks

            result = tasks.always_fails.enqueue("no")
            reports = [run_consumers(group="tasks")]
            for _ in range(2):
                advance_clock(1)  # the test settings' backoff is at most 0.1 s
                reports.append(run_consumers(group="tasks"))

            # Each run ends once the retry waits on its backoff; a backoff of at most
            # 0.1 s can also run out within a run on a slow machine, so the three runs'
            # totals are what is certain.
            self.assertEqual([sum(getattr(r, field) for r in reports)
                              for field in ("acked", "retried", "dead_lettered")], [0, 2, 1])
            self.assertGreaterEqual(reports[0].retried, 1)
            result.refresh()
            self.assertEqual(result.status.name, "FAILED")
            self.assertTrue("ValueError" in result.errors[-1].exception_class_path)


class TestInsideATestCase(ToolkitCases, TestCase):
    def test_the_test_really_is_inside_a_transaction(self) -> None:
        self.assertTrue(connection.in_atomic_block)

    def test_a_database_the_test_setup_did_not_create_is_refused(self) -> None:
        """Audit W6: called from a shell or a script, on the database the settings name,
        both entry points refuse before any statement (here the test database's connection
        is open already and stays so: only the name it is known by is the configured one)."""
        self.place_order("prod")
        configured = configured_name(connection.alias)
        self.assertTrue(configured and configured != connection.settings_dict["NAME"])
        with mock.patch.dict(connection.settings_dict, {"NAME": configured}), \
                CaptureQueriesContext(connection) as queries:
            for call in (lambda: run_consumers(group="billing"), lambda: advance_clock(60)):
                with self.assertRaises(NotATestDatabase) as refused:
                    call()
                self.assertTrue(f"refuses to run on the database {configured!r} (alias "
                                f"'default'), which Django's test setup did not create"
                                in str(refused.exception), str(refused.exception))
            self.assertEqual((len(queries), calls, clock_offset_ms()), (0, [], 0))
            # Told so, they run (on the connection already open: the test database).
            with advance_clock(60, allow_any_database=True):
                self.assertEqual(run_consumers(group="billing", allow_any_database=True),
                                 RunReport(acked=1))


class TestInsideATransactionTestCase(ToolkitCases, TransactionTestCase):
    def test_the_run_left_no_lease_behind(self) -> None:
        self.place_order("lease")
        run_consumers(group="billing")
        # (the row under the empty group records the server: sqlqueue.consuming.takeover)
        self.assertEqual(list(PartitionLease.objects.exclude(consumer_group="")), [])


class TestAcrossRoutedDatabases(TransactionTestCase):
    """SQLQUEUE["ROUTES"]: each database's consumers run on its own connection, and a
    message a handler on one publishes for the other is handled in the same call. (The
    "routes" alias mirrors "default" in the test settings: committed rows, hence a
    TransactionTestCase.)"""

    databases = {"default", "routes"}

    def test_each_alias_runs_its_consumers(self) -> None:
        self.addCleanup(unregister, "chainers", "toolkit.chain")
        self.addCleanup(unregister, "billing", "routed.orders")
        calls.clear()
        sqlqueue.consumer("toolkit.chain", group="chainers")(publish_next)
        sqlqueue.consumer("routed.orders", group="billing")(charge)
        with override_settings(SQLQUEUE={"ROUTES": {"routed.*": "routes"}}), \
                CaptureQueriesContext(connections["routes"]) as routed:
            sqlqueue.send_message("toolkit.chain", {"ref": "r", "to": "routed.orders"})
            with capture_messages(topic="routed.orders") as sent:
                report = run_consumers()
        self.assertEqual(report, RunReport(acked=2))
        self.assertEqual(sent.payloads, [{"ref": "next-r"}])
        self.assertEqual([name for name, _, _ in calls], ["publish_next", "charge"])
        self.assertTrue(routed.captured_queries)


@pytest.mark.django_db
def test_a_run_that_never_settles_stops_with_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def publish_again(message: sqlqueue.Message) -> None:
        sqlqueue.send_message("toolkit.loop", {"n": message.payload["n"] + 1})

    sqlqueue.consumer("toolkit.loop", group="loopers")(publish_again)
    monkeypatch.setattr(inline, "SETTLE_TIMEOUT", 0.3)
    try:
        sqlqueue.send_message("toolkit.loop", {"n": 0})
        with pytest.raises(sqlqueue.SqlqueueError, match=r"did not settle within 0\.3s"):
            run_consumers(group="loopers")
    finally:
        unregister("loopers", "toolkit.loop")


@pytest.mark.django_db
def test_a_handler_interrupted_stops_the_run_at_once() -> None:
    def interrupted(message: sqlqueue.Message) -> None:
        raise KeyboardInterrupt

    sqlqueue.consumer("toolkit.exit", group="exiters")(interrupted)
    try:
        sqlqueue.send_message("toolkit.exit", {})
        with counted_waits() as waits, pytest.raises(KeyboardInterrupt):
            run_consumers(group="exiters")
        # Not SHUTDOWN_TIMEOUT (30 s) of waits for an outcome that never comes.
        assert waits == []
    finally:
        unregister("exiters", "toolkit.exit")


@pytest.mark.django_db
def test_a_handler_that_exits_has_failed_as_under_runconsumer() -> None:
    """SystemExit from a handler is an outcome like any exception (guarantee I15)."""
    def exit_now(message: sqlqueue.Message) -> None:
        raise SystemExit(3)

    sqlqueue.consumer("toolkit.exit", group="exiters", max_attempts=1)(exit_now)
    try:
        sqlqueue.send_message("toolkit.exit", {})
        assert run_consumers(group="exiters") == RunReport(dead_lettered=1)
    finally:
        unregister("exiters", "toolkit.exit")
