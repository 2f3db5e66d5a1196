"""What ``manage.py demo`` does, as plain functions: sample data, a rollback, the queue,
and the consumers that handle it.

Kept apart from the command so that the steps can be read (and reused, e.g. from a
shell) without the command-line plumbing around them.
"""

from __future__ import annotations

import io
import json
import logging
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.core.management import call_command
from django.db import transaction
from django.db.models.functions import Length

from example_project.shop.models import ConfirmationEmail, Customer, Order
from example_project.shop.services import ORDERS_CREATED, LineItem, place_order
from example_project.shop.tasks import render_receipt
from sqlqueue.conf import get_settings
from sqlqueue.models import QueueMessage, TaskRecord

REFERENCE_PREFIX = "DEMO-"
SAMPLE_CUSTOMERS = [
    ("Ada Lovelace", "ada@example.com"),
    ("Grace Hopper", "grace@example.com"),
    ("Alan Turing", "alan@example.com"),
]
CATALOG = [
    ("TEA-EARL-GREY", Decimal("6.50")),
    ("MUG-STONEWARE", Decimal("12.00")),
    ("KETTLE-1L", Decimal("39.90")),
    ("BISCUITS-OAT", Decimal("3.20")),
]


class PaymentDeclined(Exception):
    """Raised by the rollback demo after the order was placed, to undo it."""


@dataclass(frozen=True)
class RollbackResult:
    """What is left in the database of an order whose transaction rolled back."""

    reference: str
    message_id: str
    order_exists: bool
    message_exists: bool
    receipt_task_exists: bool


@dataclass(frozen=True)
class QueuedMessage:
    """A stored ``queue_messages`` row, decoded for display."""

    offset: int
    partition_key: str
    id: str
    priority: int
    created_at: datetime
    payload: Any
    metadata: Any


@dataclass(frozen=True)
class ConsumerRun:
    """What ``runconsumer --until-empty`` printed and logged, and how long it took."""

    report: list[str]
    log: list[str]
    seconds: float


@dataclass(frozen=True)
class ConsumerResults:
    """The consumers' effects, read back from the database (all orders, not one run)."""

    orders: int
    paid: int
    emails: int
    emails_retried: int
    dead_letter_topic: str
    dead_letters: int
    receipts: int  # render_receipt tasks that succeeded
    latest_receipt: str | None  # the newest one's return value


def ensure_customers() -> tuple[list[Customer], int]:
    """The sample customers, created if missing; returns them and how many were new."""
    customers: list[Customer] = []
    created_count = 0
    for name, email in SAMPLE_CUSTOMERS:
        customer, created = Customer.objects.get_or_create(email=email, defaults={"name": name})
        customers.append(customer)
        created_count += created
    return customers, created_count


def demo_reference(number: int) -> str:
    """``DEMO-0001`` style: sorts well and reads well in the admin."""
    return f"{REFERENCE_PREFIX}{number:04d}"


def next_demo_number() -> int:
    """One more than the highest existing demo reference, so every run adds new orders."""
    # Longest first, then highest: DEMO-10000 comes after DEMO-9999.
    highest = (
        Order.objects.filter(reference__regex=rf"^{REFERENCE_PREFIX}[0-9]+$")
        .order_by(Length("reference").desc(), "-reference")
        .values_list("reference", flat=True)
        .first()
    )
    if highest is None:
        return 1
    return int(highest.removeprefix(REFERENCE_PREFIX)) + 1


def sample_lines(number: int) -> list[LineItem]:
    """Between one and three catalog lines, chosen by ``number`` so runs are repeatable."""
    lines = []
    for i in range(1 + number % 3):
        sku, price = CATALOG[(number + i) % len(CATALOG)]
        lines.append(LineItem(sku=sku, quantity=1 + (number + i) % 3, unit_price=price))
    return lines


def place_demo_orders(customers: list[Customer], count: int, first_number: int) -> list[Order]:
    """Place ``count`` orders through ``place_order``, one transaction each."""
    orders = []
    for number in range(first_number, first_number + count):
        customer = customers[(number - 1) % len(customers)]
        orders.append(
            place_order(customer, sample_lines(number), reference=demo_reference(number))
        )
    return orders


def demonstrate_rollback(customer: Customer, number: int) -> RollbackResult:
    """Place an order inside an outer transaction that then fails, and look for traces.

    ``place_order``'s atomic block becomes a savepoint of the outer one, so when the
    payment step raises, the order, its lines and its message are all undone.
    """
    reference = demo_reference(number)
    receipt_tasks = TaskRecord.objects.filter(task_path=render_receipt.module_path)
    receipt_tasks_before = receipt_tasks.count()
    try:
        with transaction.atomic():
            place_order(customer, sample_lines(number), reference=reference)
            raise PaymentDeclined(f"card declined for order {reference}")
    except PaymentDeclined:
        pass
    message_id = f"order-{reference}"
    return RollbackResult(
        reference=reference,
        message_id=message_id,
        order_exists=Order.objects.filter(reference=reference).exists(),
        message_exists=QueueMessage.objects.filter(topic=ORDERS_CREATED, id=message_id).exists(),
        receipt_task_exists=receipt_tasks.count() != receipt_tasks_before,
    )


def run_consumers() -> ConsumerRun:
    """Run every registered consumer until nothing is left to do, as a worker would.

    This is ``manage.py runconsumer --until-empty``, called in-process so that its report
    and its warnings (a handler's failure is logged) can be shown in the demo's own
    layout rather than interleaved on stderr.
    """
    output = io.StringIO()
    started = time.monotonic()
    with _captured_log("sqlqueue") as log, _unlogged("django.tasks"), \
            _signal_handlers_restored():
        call_command("runconsumer", until_empty=True, stdout=output)
    return ConsumerRun(
        report=output.getvalue().splitlines(),
        log=log,
        seconds=time.monotonic() - started,
    )


def consumer_results(topic: str = ORDERS_CREATED) -> ConsumerResults:
    """Counts that show what the consumers did, independent of runconsumer's report."""
    dead_letter_topic = topic + get_settings().DLQ_SUFFIX
    emails = ConfirmationEmail.objects.all()
    receipts = TaskRecord.objects.filter(task_path=render_receipt.module_path,
                                         status="SUCCESSFUL")
    latest = receipts.order_by("-finished_at").values_list("id", flat=True).first()
    return ConsumerResults(
        orders=Order.objects.count(),
        paid=Order.objects.filter(status=Order.Status.PAID).count(),
        emails=emails.count(),
        emails_retried=emails.filter(attempt__gt=1).count(),
        dead_letter_topic=dead_letter_topic,
        dead_letters=QueueMessage.objects.filter(topic=dead_letter_topic).count(),
        receipts=receipts.count(),
        # Read back through Django's API, as application code would.
        latest_receipt=None if latest is None else render_receipt.get_result(latest).return_value,
    )


#: the example's schedule (settings.SQLQUEUE["SCHEDULES"])
SALES_REPORT = "daily-sales-report"


@dataclass(frozen=True)
class ScheduleShown:
    name: str
    definition: str
    next_tick: str
    message_id: str


def run_sales_report_now() -> list[ScheduleShown]:
    """``manage.py queue schedules run daily-sales-report``: one tick of the schedule now,
    besides its daily ones; then every schedule as ``queue schedules`` lists it."""
    from sqlqueue.operations.schedules import (
        current_time_ms,
        run_schedule_now,
        schedule_overview,
    )

    published = run_schedule_now(SALES_REPORT)
    return [
        ScheduleShown(
            view.name, view.definition,
            "-" if view.next_tick_ms is None else iso_utc(epoch_ms_to_datetime(
                view.next_tick_ms)),
            published.message_id if view.name == SALES_REPORT else "",
        )
        for view in schedule_overview(current_time_ms())
    ]


def latest_sales_report() -> str | None:
    from example_project.shop.tasks import sales_report

    latest = (TaskRecord.objects.filter(task_path=sales_report.module_path, status="SUCCESSFUL")
              .order_by("-finished_at").values_list("id", flat=True).first())
    return None if latest is None else sales_report.get_result(latest).return_value


class _ListHandler(logging.Handler):
    """Keeps formatted records in a list (logging serialises ``emit`` across threads)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


@contextmanager
def _captured_log(name: str) -> Iterator[list[str]]:
    """Collect ``name``'s warnings and errors; with a handler attached they no longer
    reach Python's last-resort stderr handler."""
    lines: list[str] = []
    handler = _ListHandler(lines)
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


@contextmanager
def _unlogged(name: str) -> Iterator[None]:
    """Keep ``name``'s records out of the console for a while: Django logs every task
    start and finish at INFO, which would interleave with the demo's own layout."""
    logger = logging.getLogger(name)
    saved = logger.propagate
    logger.propagate = False
    try:
        yield
    finally:
        logger.propagate = saved


@contextmanager
def _signal_handlers_restored() -> Iterator[None]:
    """runconsumer installs its graceful-stop handlers; put the previous ones back so
    that Ctrl-C stops the rest of the demo as usual."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, previous in saved.items():
            if previous is not None:  # None: not installed from Python; leave it be
                signal.signal(signum, previous)


def recent_messages(topic: str = ORDERS_CREATED, limit: int = 20) -> list[QueuedMessage]:
    """The newest ``limit`` messages of ``topic``, returned oldest first like a log."""
    rows = QueueMessage.objects.filter(topic=topic).order_by("-offset")[:limit]
    return [
        QueuedMessage(
            offset=row.offset,
            partition_key=row.partition_key,
            id=row.id,
            priority=row.priority,
            created_at=epoch_ms_to_datetime(row.created_at),
            payload=decode_payload(row.payload),
            metadata=row.metadata,
        )
        for row in reversed(rows)
    ]


def count_messages(topic: str = ORDERS_CREATED) -> int:
    """All stored messages of ``topic`` (consumed or not; nothing is deleted here)."""
    return QueueMessage.objects.filter(topic=topic).count()


def epoch_ms_to_datetime(value: int) -> datetime:
    """sqlqueue stores times as epoch milliseconds; integer maths keeps them exact."""
    seconds, millis = divmod(value, 1000)
    return datetime.fromtimestamp(seconds, tz=UTC) + timedelta(milliseconds=millis)


def iso_utc(moment: datetime) -> str:
    """``2025-01-31T12:00:00.123Z``: unambiguous and sortable."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def decode_payload(raw: bytes | memoryview) -> Any:
    """Payloads are UTF-8 JSON bytes; show anything else (another producer?) as is."""
    data = bytes(raw)
    try:
        return json.loads(data)
    except ValueError:
        return data


def plural(count: int, noun: str) -> str:
    """``1 order``, ``2 orders``: the demo's output is read by people."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def format_orders(orders: list[Order]) -> list[str]:
    """One aligned line per placed order."""
    name_width = max((len(order.customer.name) for order in orders), default=0)
    lines = []
    for order in orders:
        lines.append(
            f"{order.reference}  {order.customer.name:<{name_width}}  "
            f"{plural(order.lines.count(), 'line'):<7}  total {order.total:>7}"
        )
    return lines


def format_messages(messages: list[QueuedMessage], width: int = 96) -> list[str]:
    """A table of messages, each row followed by its decoded payload and metadata.

    The JSON is wrapped at ``width`` columns, between items only, so that it stays
    readable under its row.
    """
    header = ("offset", "partition key", "message id", "priority", "created at (UTC)")
    rows = [
        (str(m.offset), m.partition_key, m.id, str(m.priority), iso_utc(m.created_at))
        for m in messages
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    right_aligned = {0, 3}

    def render(cells: tuple[str, ...]) -> str:
        return "  ".join(
            cell.rjust(width) if index in right_aligned else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    indent = " " * (widths[0] + 2)
    lines = [render(header), render(tuple("-" * width for width in widths))]
    for message, row in zip(messages, rows, strict=True):
        lines.append(render(row))
        lines.extend(_labelled(f"{indent}payload:  ", message.payload, width))
        if message.metadata:
            lines.extend(_labelled(f"{indent}metadata: ", message.metadata, width))
    return lines


def _labelled(label: str, value: Any, width: int) -> list[str]:
    if isinstance(value, bytes):
        return [label + repr(value)]
    return (label + _fill_json(value, len(label), width)).splitlines()


def _fill_json(value: Any, column: int, width: int) -> str:
    """JSON for ``value`` starting at ``column``: one line if it fits, else filled.

    Items are packed onto lines greedily; an item too long for a line of its own is
    filled the same way, its continuation lines aligned just inside its bracket.
    """
    compact = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if column + len(compact) <= width or not isinstance(value, dict | list) or not value:
        return compact
    if isinstance(value, dict):
        opener, closer = "{", "}"
        items = [(json.dumps(key, ensure_ascii=False) + ": ", item) for key, item in value.items()]
    else:
        opener, closer = "[", "]"
        items = [("", item) for item in value]
    inner = column + 1
    text, line_column = opener, inner
    for index, (prefix, item) in enumerate(items):
        tail = closer if index == len(items) - 1 else ","
        if index:
            single = prefix + json.dumps(item, ensure_ascii=False, separators=(", ", ": "))
            if line_column + 1 + len(single) + len(tail) <= width:
                text, line_column = text + " ", line_column + 1
            else:
                text, line_column = text + "\n" + " " * inner, inner
        piece = prefix + _fill_json(item, line_column + len(prefix), width) + tail
        text += piece
        if "\n" in piece:
            line_column = len(piece.rsplit("\n", 1)[1])
        else:
            line_column += len(piece)
    return text

