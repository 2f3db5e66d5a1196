"""``manage.py demo [--orders N]``: place sample orders and show what was queued."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from example_project.shop import demo
from example_project.shop.models import Order
from example_project.shop.services import ORDERS_CREATED

SHOWN_MESSAGES = 20


class Command(BaseCommand):
    help = (
        "Place sample orders through place_order(), show that a rolled-back order leaves "
        f"no message behind, and list the newest '{ORDERS_CREATED}' messages."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--orders", type=int, default=5, metavar="N",
            help="How many sample orders to place (default: 5).",
        )

    def handle(self, *args: Any, orders: int, **options: Any) -> None:
        if orders < 0:
            raise CommandError("--orders must be 0 or more.")
        heading, write = self.style.MIGRATE_HEADING, self.stdout.write

        customers, created = demo.ensure_customers()
        write(heading("Customers"))
        write(f"  {', '.join(c.name for c in customers)} ({created} created, "
              f"{len(customers) - created} already there)")

        first = demo.next_demo_number()
        placed = demo.place_demo_orders(customers, orders, first)
        write("")
        write(heading(f"Placed {demo.plural(len(placed), 'order')}"))
        write("  Each order, its lines and its message were committed in one transaction.")
        for line in demo.format_orders(placed):
            write(f"  {line}")

        rollback = demo.demonstrate_rollback(customers[0], first + orders)
        write("")
        write(heading("An order whose transaction rolls back"))
        write(f"  {rollback.reference} was placed inside an outer transaction.atomic(); the "
              "payment step")
        write("  that followed raised PaymentDeclined, so the whole block rolled back.")
        write(f"  Order {rollback.reference} in the database:  "
              f"{'yes' if rollback.order_exists else 'no'}")
        write(f"  Message {rollback.message_id!r} in the queue: "
              f"{'yes' if rollback.message_exists else 'no'}")
        if rollback.order_exists or rollback.message_exists:
            write(self.style.ERROR("  Something survived the rollback: that is a bug."))
        else:
            write(self.style.SUCCESS("  Neither exists: the order and its message were "
                                     "rolled back together."))

        messages = demo.recent_messages(ORDERS_CREATED, SHOWN_MESSAGES)
        write("")
        write(heading(f"Newest {demo.plural(len(messages), 'message')} on "
                      f"'{ORDERS_CREATED}' (oldest first)"))
        for line in demo.format_messages(messages) if messages else ["(none)"]:
            write(f"  {line}")

        total_messages, total_orders = demo.count_messages(ORDERS_CREATED), Order.objects.count()
        write("")
        write(self.style.SUCCESS(
            f"Summary: {demo.plural(len(placed), 'order')} placed and queued this run, "
            f"1 rolled back with no message; '{ORDERS_CREATED}' holds "
            f"{demo.plural(total_messages, 'message')} for "
            f"{demo.plural(total_orders, 'order')} in total."
        ))
