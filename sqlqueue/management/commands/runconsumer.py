"""``manage.py runconsumer``: run the registered consumers until stopped."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.runner import Runner
from sqlqueue.exceptions import ConfigurationError


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Run the registered sqlqueue consumers (all, or those selected with --group and "
        "--topic). First SIGINT/SIGTERM: finish in-flight handlers and exit; second: exit "
        "at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--group", action="append", default=[],
                            help="Run only this consumer group (repeatable).")
        parser.add_argument("--topic", action="append", default=[],
                            help="Run only consumers of this topic (repeatable).")
        parser.add_argument("--threads", type=_positive,
                            help="Handler threads (default: SQLQUEUE['THREADS']).")
        parser.add_argument("--name", help="Subscriber name (default: hostname-pid).")
        parser.add_argument("--until-empty", action="store_true",
                            help="Exit once nothing is deliverable, in flight or retrying.")
        parser.add_argument("--max-messages", type=_positive,
                            help="Exit after handling this many messages.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            consumers = select_consumers(options["group"], options["topic"])
            runner = Runner(
                consumers,
                threads=options["threads"],
                name=options["name"],
                until_empty=options["until_empty"],
                max_messages=options["max_messages"],
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        if options["verbosity"] >= 2:
            logging.getLogger("sqlqueue").setLevel(logging.DEBUG)
        runner.run()
        if options["verbosity"] >= 1:
            self._report(runner)

    def _report(self, runner: Runner) -> None:
        for subscriber in runner.subscribers:
            s = subscriber.stats
            self.stdout.write(
                f"{subscriber.consumer.name}: {s['acked']} acked, {s['retried']} retried, "
                f"{s['dead_lettered']} dead-lettered"
            )
