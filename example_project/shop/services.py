"""Placing orders: the order rows and the ``orders.created`` message commit together.

This is the point of a queue stored in the application's own database: the message is
written in the same transaction as the order, so consumers see an order event if and
only if the order exists. There is no window where the order is saved but the event is
lost (a crash after commit), or announced but rolled back (an error after publishing).
The receipt, a Django task (``shop/tasks.py``), is enqueued the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction

import sqlqueue
from example_project.shop.models import Customer, Order, OrderLine
from example_project.shop.tasks import render_receipt

ORDERS_CREATED = "orders.created"
CENTS = Decimal("0.01")
# What OrderLine.unit_price and Order.total can hold (max_digits 10 and 12, 2 places).
MAX_UNIT_PRICE = Decimal("99999999.99")
MAX_TOTAL = Decimal("9999999999.99")
SKU_LENGTH = OrderLine._meta.get_field("sku").max_length or 64
MAX_QUANTITY = 2_147_483_647  # the largest value a PositiveIntegerField holds everywhere


@dataclass(frozen=True)
class LineItem:
    """One line of an order to place: ``quantity`` units of ``sku`` at ``unit_price``."""

    sku: str
    quantity: int
    unit_price: Decimal


def place_order(
    customer: Customer, lines: Sequence[LineItem], *, reference: str | None = None
) -> Order:
    """Create an order with its lines and publish ``orders.created``, atomically.

    ``reference`` defaults to a random ``ORD-...`` one. Raises ``ValueError`` for invalid
    lines before anything is written. If the caller's own transaction later rolls back,
    the order and its message disappear together.
    """
    if customer.pk is None:
        raise ValueError("Save the customer before placing an order for them.")
    items = _validated(lines)
    if reference is None:
        reference = f"ORD-{uuid.uuid4().hex[:12].upper()}"
    total = sum((item.quantity * item.unit_price for item in items), Decimal("0.00"))
    if total > MAX_TOTAL:
        raise ValueError(f"The order total {total} is more than {MAX_TOTAL}.")

    # The queue publishes on the "default" database (SQLQUEUE["DATABASE"]), the same one
    # as the shop's tables, so this single atomic block covers both.
    with transaction.atomic():
        order = Order.objects.create(customer=customer, reference=reference, total=total)
        OrderLine.objects.bulk_create(
            OrderLine(order=order, sku=item.sku, quantity=item.quantity,
                      unit_price=item.unit_price)
            for item in items
        )
        sqlqueue.send_message(
            ORDERS_CREATED,
            {
                "order_id": order.pk,
                "reference": order.reference,
                "customer_id": customer.pk,
                "total": str(total),
                "lines": [
                    {"sku": item.sku, "quantity": item.quantity,
                     "unit_price": str(item.unit_price)}
                    for item in items
                ],
            },
            partition_key=f"customer-{customer.pk}",  # one customer's events stay in order
            id=f"order-{order.reference}",  # a retried publish is deduplicated
            metadata={"source": "shop"},
        )
        # A Django task, enqueued through sqlqueue in the same transaction: it runs only
        # if the order commits (settings.TASKS, shop/tasks.py).
        render_receipt.enqueue(order.reference)
    return order


def _validated(lines: Sequence[LineItem]) -> list[LineItem]:
    """Check every line up front, so a bad one never leaves half an order behind."""
    if len(lines) == 0:
        raise ValueError("An order needs at least one line.")
    items: list[LineItem] = []
    for number, line in enumerate(lines, start=1):
        sku = line.sku.strip() if isinstance(line.sku, str) else ""
        if not sku:
            raise ValueError(f"Line {number}: the SKU must not be empty.")
        if len(sku) > SKU_LENGTH:
            raise ValueError(f"Line {number}: the SKU is longer than {SKU_LENGTH} characters.")
        if isinstance(line.quantity, bool) or not isinstance(line.quantity, int):
            raise ValueError(f"Line {number}: the quantity must be a whole number.")
        if line.quantity <= 0:
            raise ValueError(f"Line {number}: the quantity must be positive, "
                             f"not {line.quantity}.")
        if line.quantity > MAX_QUANTITY:
            raise ValueError(f"Line {number}: the quantity {line.quantity} is too large.")
        try:
            unit_price = Decimal(line.unit_price)
        except (TypeError, ArithmeticError) as exc:
            raise ValueError(f"Line {number}: {line.unit_price!r} is not a price.") from exc
        if not unit_price.is_finite() or not 0 <= unit_price <= MAX_UNIT_PRICE:
            raise ValueError(f"Line {number}: the unit price must be between 0 and "
                             f"{MAX_UNIT_PRICE}, not {line.unit_price}.")
        if unit_price != unit_price.quantize(CENTS):
            raise ValueError(f"Line {number}: the unit price {unit_price} has more than "
                             "two decimal places.")
        items.append(LineItem(sku, line.quantity, unit_price))
    return items
