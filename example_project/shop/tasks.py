"""A Django task, run by sqlqueue: the receipt of an order.

``place_order`` enqueues it in the same transaction as the order (the backend is
``sqlqueue.tasks.SQLQueueBackend``, settings.TASKS), so a rolled-back order leaves no
receipt task behind, and ``manage.py runconsumer`` runs it like any consumer, with
retries. Its return value is the task's result, read back with ``get_result()``.
"""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport (pip install django-tasks)
    from django_tasks import task  # type: ignore[no-redef]

from decimal import Decimal

from example_project.shop.models import Order


@task
def render_receipt(reference: str) -> str:
    """The receipt's text: what a real shop would e-mail or store as a PDF."""
    order = Order.objects.prefetch_related("lines").get(reference=reference)
    lines = [f"{line.quantity} x {line.sku} @ {line.unit_price}" for line in order.lines.all()]
    return f"Receipt {order.reference}: {'; '.join(lines)}; total {order.total}"


@task
def sales_report() -> str:
    """The shop's daily sales figures: scheduled every morning by SQLQUEUE["SCHEDULES"]
    (settings.py), published by whichever runconsumer is running, once per day."""
    from django.db.models import Count, Sum

    totals = Order.objects.aggregate(orders=Count("pk"), revenue=Sum("total"))
    revenue = Decimal(totals["revenue"] or 0).quantize(Decimal("0.01"))
    return f"{totals['orders']} orders, {revenue} in revenue"
