"""The shop's tests in pytest's style, with sqlqueue's fixtures (docs/guides/testing.md
quotes them). Run with::

    pytest --ds=example_project.settings example_project/shop/pytest_examples.py
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from example_project.shop.models import Customer, Order
from example_project.shop.services import LineItem, place_order


@pytest.mark.django_db
def test_order_is_paid(sqlqueue_run: Any, sqlqueue_captured: Any) -> None:
    customer = Customer.objects.create(name="Ada", email="ada@example.com")
    order = place_order(customer, [LineItem("BOOK", 2, Decimal("6.00"))])

    assert [m.topic for m in sqlqueue_captured] == ["orders.created", "tasks.default"]
    report = sqlqueue_run(group="billing")

    assert report.acked == 1
    order.refresh_from_db()
    assert order.status == Order.Status.PAID


@pytest.mark.django_db
def test_a_failing_handler_fails_the_test(sqlqueue_run: Any) -> None:
    customer = Customer.objects.create(name="Ada", email="ada@example.com")
    place_order(customer, [LineItem("TV", 1, Decimal("499.00"))])  # > 100: flaky

    with pytest.raises(ConnectionError, match="mail provider timed out"):
        sqlqueue_run(group="emails", raise_errors=True)
