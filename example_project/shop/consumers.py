"""What happens after an order is placed: two consumer groups of ``orders.created``.

sqlqueue imports this module at startup (every installed app's ``consumers.py``), and
``manage.py runconsumer`` runs the handlers. Each group receives every message, on its
own: billing failing or lagging changes nothing for emails, and the other way round.
"""

from __future__ import annotations

from decimal import Decimal

from django.db.models import QuerySet

import sqlqueue
from example_project.shop.models import ConfirmationEmail, Order
from example_project.shop.services import ORDERS_CREATED

BILLING = "billing"
EMAILS = "emails"
# The simulated mail provider times out on the first try for orders above this total.
FLAKY_ABOVE = Decimal("100")


@sqlqueue.consumer(ORDERS_CREATED, group=BILLING, atomic=True)
def charge_order(message: sqlqueue.Message) -> None:
    """Mark the order paid.

    ``atomic=True``: the status change and the ack commit in one transaction, so an order
    is never charged twice by a redelivery, nor marked paid without its message acked.
    """
    # Locked until the commit, so a concurrent change (say, shipping) is not overwritten.
    order = _order_of(message, Order.objects.select_for_update())
    if order.status == Order.Status.PLACED:  # never move a shipped order back to paid
        order.status = Order.Status.PAID
        order.save(update_fields=["status"])


@sqlqueue.consumer(ORDERS_CREATED, group=EMAILS, min_backoff=0.2, max_backoff=1)
def send_confirmation(message: sqlqueue.Message) -> None:
    """E-mail the customer that their order was received.

    Not atomic (a real e-mail cannot be rolled back), so delivery is at least once: an
    e-mail already recorded for the order means an earlier delivery sent it and only its
    ack was lost, and it is not sent again.
    """
    order = _order_of(message, Order.objects.all())
    if ConfirmationEmail.objects.filter(order=order).exists():
        return
    _deliver_email(order, message.attempt)
    ConfirmationEmail.objects.create(order=order, attempt=message.attempt)


def _order_of(message: sqlqueue.Message, orders: QuerySet[Order]) -> Order:
    """The order a message announces; one that does not exist can never be handled, so
    it is dead-lettered at once rather than retried."""
    order_id = message.payload["order_id"]
    try:
        return orders.get(pk=order_id)
    except Order.DoesNotExist:
        raise sqlqueue.Reject(f"order {order_id} does not exist") from None


def _deliver_email(order: Order, attempt: int) -> None:
    """Stand-in for a mail provider's API, flaky in a repeatable way for the demo: the
    first attempt for a large order times out, the next one succeeds."""
    if attempt == 1 and order.total > FLAKY_ABOVE:
        raise ConnectionError("mail provider timed out")
