"""The shop's own tests: its consumers and its receipt task, tested with sqlqueue.testing
(docs/guides/testing.md quotes them; tests/unit/test_testing_guide.py keeps the two alike).

Run them with ``manage.py test example_project.shop``.
"""

from __future__ import annotations

from decimal import Decimal
from io import StringIO

from django.core.management import call_command
from django.test import TestCase, TransactionTestCase

import sqlqueue
from example_project.shop import consumers
from example_project.shop.models import ConfirmationEmail, Customer, Order
from example_project.shop.services import LineItem, place_order
from example_project.shop.tasks import render_receipt
from sqlqueue.testing import (
    advance_clock,
    capture_messages,
    make_message,
    reset_clock,
    run_consumers,
)


class ChargeOrderTests(TestCase):
    """Unit tests: call the handler with a message, no queue involved."""

    def test_a_placed_order_is_paid(self) -> None:
        customer = Customer.objects.create(name="Ada", email="ada@example.com")
        order = Order.objects.create(customer=customer, reference="R-1", total=Decimal("12"))

        consumers.charge_order(make_message({"order_id": order.pk}, group="billing"))

        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.PAID)

    def test_an_unknown_order_is_rejected(self) -> None:
        with self.assertRaises(sqlqueue.Reject):
            consumers.charge_order(make_message({"order_id": 999}))


class CheckoutTests(TestCase):
    """Integration tests: publish for real, run the consumers inside the test."""

    def setUp(self) -> None:
        self.customer = Customer.objects.create(name="Ada", email="ada@example.com")
        self.addCleanup(reset_clock)

    def test_order_is_paid(self) -> None:
        with capture_messages(topic="orders.created") as sent:
            order = place_order(self.customer, [LineItem("BOOK", 2, Decimal("6.00"))])
        self.assertEqual(sent[0].payload["total"], "12.00")

        report = run_consumers(group="billing")

        self.assertEqual((report.acked, report.dead_lettered), (1, 0))
        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.PAID)

    def test_the_email_is_sent_again_after_a_timeout(self) -> None:
        place_order(self.customer, [LineItem("TV", 1, Decimal("499.00"))])  # > 100: flaky

        first = run_consumers(group="emails")
        self.assertEqual((first.acked, first.retried), (0, 1))  # waits for its backoff

        advance_clock(seconds=2)  # past the consumer's max_backoff of 1 s
        second = run_consumers(group="emails")

        self.assertEqual(second.acked, 1)
        self.assertEqual(ConfirmationEmail.objects.get().attempt, 2)

    def test_a_handlers_error_is_in_the_report(self) -> None:
        place_order(self.customer, [LineItem("TV", 1, Decimal("499.00"))])  # > 100: flaky

        report = run_consumers(group="emails")

        [error] = report.errors  # each: the message, the exception, its traceback
        self.assertEqual(error.message.attempt, 1)
        self.assertIsInstance(error.exception, ConnectionError)
        self.assertIn("in _deliver_email", error.traceback)

    def test_raise_errors_fails_the_test_with_the_handlers_exception(self) -> None:
        place_order(self.customer, [LineItem("TV", 1, Decimal("499.00"))])  # > 100: flaky

        with self.assertRaisesMessage(ConnectionError, "mail provider timed out"):
            run_consumers(group="emails", raise_errors=True)

    def test_the_receipt_task_runs(self) -> None:
        with capture_messages(topic="tasks.default") as enqueued:
            order = place_order(self.customer, [LineItem("PEN", 3, Decimal("1.50"))])
        self.assertEqual(len(enqueued), 1)

        run_consumers(group="tasks")

        result = render_receipt.get_result(enqueued[0].id)
        self.assertEqual(result.status.name, "SUCCESSFUL")
        self.assertIn(order.reference, result.return_value)


class EndToEndTests(TransactionTestCase):
    """A real runconsumer, as in production: outside any transaction, handler threads on
    connections of their own. Slower; keep such tests few."""

    def test_runconsumer_handles_the_order(self) -> None:
        customer = Customer.objects.create(name="Ada", email="ada@example.com")
        order = place_order(customer, [LineItem("BOOK", 1, Decimal("6.00"))])

        call_command("runconsumer", group=["billing"], until_empty=True, no_schedules=True,
                     stdout=StringIO())

        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.PAID)
