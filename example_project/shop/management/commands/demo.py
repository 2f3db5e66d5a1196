"""``manage.py demo [--orders N]``: place sample orders, show what was queued, and run
the consumers that handle it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from example_project.shop import consumers, demo
from example_project.shop.models import Order
from example_project.shop.services import ORDERS_CREATED

SHOWN_MESSAGES = 20


class Command(BaseCommand):
    help = (
        "Place sample orders through place_order(), show that a rolled-back order leaves "
        f"no message behind, list the newest '{ORDERS_CREATED}' messages, then run the "
        "consumers (runconsumer --until-empty) and show what they did."
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
        write(f"  Its receipt task (Django Tasks): "
              f"{'yes' if rollback.receipt_task_exists else 'no'}")
        if rollback.order_exists or rollback.message_exists or rollback.receipt_task_exists:
            write(self.style.ERROR("  Something survived the rollback: that is a bug."))
        else:
            write(self.style.SUCCESS("  None exists: the order, its message and its task "
                                     "were rolled back together."))

        messages = demo.recent_messages(ORDERS_CREATED, SHOWN_MESSAGES)
        write("")
        write(heading(f"Newest {demo.plural(len(messages), 'message')} on "
                      f"'{ORDERS_CREATED}' (oldest first)"))
        for line in demo.format_messages(messages) if messages else ["(none)"]:
            write(f"  {line}")

        write("")
        write(heading("Schedules (SQLQUEUE['SCHEDULES'])"))
        write("  Every runconsumer publishes the due ticks, each exactly once however many run;")
        write("  this demo also publishes one tick of the sales report now "
              "(manage.py queue schedules run):")
        for shown in demo.run_sales_report_now():
            write(f"  {shown.name}: {shown.definition}; next tick {shown.next_tick}")
            if shown.message_id:
                write(f"    published now: {shown.message_id}")

        self.show_consumers(demo.run_consumers(), demo.consumer_results(ORDERS_CREATED))
        report = demo.latest_sales_report()
        write(f"  Sales report (scheduled task): {report or '(not run)'}")

        total_messages, total_orders = demo.count_messages(ORDERS_CREATED), Order.objects.count()
        write("")
        write(self.style.SUCCESS(
            f"Summary: {demo.plural(len(placed), 'order')} placed and queued this run, "
            f"1 rolled back with no message; '{ORDERS_CREATED}' holds "
            f"{demo.plural(total_messages, 'message')} for "
            f"{demo.plural(total_orders, 'order')} in total."
        ))

    def show_consumers(self, run: demo.ConsumerRun, results: demo.ConsumerResults) -> None:
        """The consumers section: runconsumer's own report, then the database's view."""
        write = self.stdout.write
        write("")
        write(self.style.MIGRATE_HEADING("Consumers"))
        write(f"  manage.py runconsumer --until-empty ran every registered consumer until "
              f"nothing was left ({run.seconds:.1f}s):")
        for line in run.report or ["(no consumers registered)"]:
            write(f"    {line}")
        if run.log:
            write("  What it logged along the way:")
            for line in run.log:
                write(f"    {line}")
        write(f"  {consumers.BILLING}: marked each order paid in the same transaction as its "
              "ack (atomic=True).")
        write(f"  {consumers.EMAILS}: the simulated mail provider times out on the first "
              f"attempt for orders over {consumers.FLAKY_ABOVE};")
        write("    those messages were retried after a short backoff (0.2 to 1s) and went "
              "through.")
        write(f"  Orders paid:          {results.paid} of {results.orders}")
        write(f"  Confirmation e-mails: {results.emails} "
              f"({results.emails_retried} needed a second attempt)")
        write("  tasks: ran render_receipt, a Django @task enqueued by place_order "
              "(sqlqueue.tasks.SQLQueueBackend).")
        write(f"  Receipts rendered:    {results.receipts}")
        if results.latest_receipt:
            write(f"    newest result: {results.latest_receipt}")
        dead_letters = (f"  Dead letters:         {results.dead_letters} on "
                        f"'{results.dead_letter_topic}'")
        if results.dead_letters:
            write(self.style.ERROR(dead_letters + " (queue_messages.last_error says why)"))
        else:
            write(dead_letters)
