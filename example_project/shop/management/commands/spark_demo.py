"""``manage.py spark_demo [--orders N] [--seconds S] [--out DIR]``: the shop's traffic
with live workers, then the Spark analytics job in local mode over the same database;
prints where the report is (and opens nothing).

The traffic: ``runconsumer`` runs in the background (billing, emails and the receipt
task) while orders arrive at a steady pace for ``--seconds``, with a burst of a quarter of
them halfway, and one order event for an order that does not exist, which both groups
dead-letter. Orders over 100 make the simulated mail provider time out once, so their
e-mails take a second attempt. Then the analytics job runs through ``spark-submit``, as it
would on a cluster (``--master local[2]``), with one-second buckets: the traffic lasts
seconds, not hours.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

import sqlqueue
from example_project.shop import demo
from example_project.shop.models import Customer
from example_project.shop.services import ORDERS_CREATED, place_order

DRAIN_TIMEOUT = 120.0  # seconds the workers get to finish after the last order


class Command(BaseCommand):
    help = ("Run the shop's traffic with live workers, then the Spark analytics job in local "
            "mode; print where its report is.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--orders", type=int, default=60, metavar="N",
                            help="Orders to place (default: 60).")
        parser.add_argument("--seconds", type=float, default=20.0, metavar="S",
                            help="Over how long (default: 20).")
        parser.add_argument("--out", default=str(Path(settings.BASE_DIR) / "example_project"
                                                 / "spark-report"),
                            metavar="DIR", help="Where the report goes.")

    def handle(self, *args: Any, orders: int, seconds: float, out: str,
               **options: Any) -> None:
        try:
            from sqlqueue.integrations.spark.session import prepare_environment
            from sqlqueue.spark import database_url
        except ImportError as exc:
            raise CommandError(
                f"The Spark demo needs pip install 'django-sqlqueue[spark]' ({exc}).") from None
        if orders < 1 or seconds < 0:
            raise CommandError("--orders must be at least 1 and --seconds at least 0.")
        heading, write = self.style.MIGRATE_HEADING, self.stdout.write

        write(heading(f"Traffic: {orders} orders over {seconds:g}s, workers running"))
        workers = self._start_workers()
        try:
            started = time.monotonic()
            self._place_orders(orders, seconds)
            write(f"  placed {orders} orders and one event for a missing order "
                  f"in {time.monotonic() - started:.1f}s")
            self._wait_until_done()
            write(f"  the workers finished everything after {time.monotonic() - started:.1f}s")
        finally:
            workers.send_signal(signal.SIGINT)  # graceful: finish, hand over, deregister
            try:
                workers.wait(60)
            except subprocess.TimeoutExpired:
                # A second signal exits at once (what an operator would do); the demo's
                # work is done and recorded by now.
                self.stderr.write("runconsumer did not stop within 60 s; signalling again.")
                workers.send_signal(signal.SIGINT)
                workers.wait(30)

        write("")
        write(heading("Spark: the analytics job over the same database"))
        prepare_environment()  # the Python Spark's workers run, and Java
        job = Path(sys.modules["sqlqueue"].__file__ or "").parent / "spark" / "analytics.py"
        submit = Path(sys.executable).parent / "spark-submit"
        write(f"  DATABASE_URL=... spark-submit --master local[2] {job.name} --out {out} "
              "--bucket second")
        self.stdout.flush()
        result = subprocess.run(
            [str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false", str(job),
             "--out", out, "--bucket", "second"],
            # The url (password included) goes in the environment: argv is public (ps).
            env={**os.environ, "PYTHONPATH": str(settings.BASE_DIR),
                 "DATABASE_URL": database_url()},
            capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise CommandError(f"The analytics job failed:\n{result.stderr[-4000:]}")
        for line in result.stdout.splitlines():
            write(f"  {line}")
        write(self.style.SUCCESS(
            f"The report is at {Path(out) / 'report.html'} (open it in a browser)."))

    @staticmethod
    def _start_workers() -> subprocess.Popen[bytes]:
        manage = Path(settings.BASE_DIR) / "manage.py"
        return subprocess.Popen([sys.executable, str(manage), "runconsumer"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @staticmethod
    def _place_orders(count: int, seconds: float) -> None:
        """A steady pace, a burst of a quarter of the orders halfway, and a poison event."""
        customers, _ = demo.ensure_customers()
        first = demo.next_demo_number()
        burst = count // 4
        steady = count - burst
        pause = seconds / max(1, steady)
        for n, number in enumerate(range(first, first + count)):
            _place(customers, number)
            if n == steady // 2:
                sqlqueue.send_message(ORDERS_CREATED, {"order_id": 0, "reference": "MISSING"},
                                      partition_key="customer-0",
                                      id=f"order-missing-{uuid.uuid4()}")
            if not steady // 2 <= n < steady // 2 + burst:
                time.sleep(pause)  # the pace of the traffic, outside the burst

    @staticmethod
    def _wait_until_done() -> None:
        from sqlqueue.operations.lag import group_lag, known_subscriptions

        deadline = time.monotonic() + DRAIN_TIMEOUT
        while time.monotonic() < deadline:
            lags = [group_lag(group, topic) for group, topic in known_subscriptions()]
            if lags and all(lag.pending == 0 for lag in lags):
                return
            time.sleep(0.5)
        raise CommandError(f"The workers did not finish within {DRAIN_TIMEOUT:.0f}s.")


def _place(customers: list[Customer], number: int) -> None:
    customer = customers[(number - 1) % len(customers)]
    place_order(customer, demo.sample_lines(number), reference=demo.demo_reference(number))
