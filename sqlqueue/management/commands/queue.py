"""``manage.py queue``: the operator's verbs, the same as the admin's actions.

    manage.py queue status [--group G] [--topic T] [--partitions]
    manage.py queue health [--group G] [--topic T] [--json] | --liveness-file F [--max-age S]
    manage.py queue dead-letters list [--group G] [--topic T] [--limit N] [--database A]
    manage.py queue dead-letters replay OFFSET... | --all [--group G] [--topic T] [--database A]
    manage.py queue dead-letters discard OFFSET... | --all [--group G] [--topic T] --yes
    manage.py queue retry-now GROUP TOPIC [--partition KEY]
    manage.py queue reset-position GROUP TOPIC KEY (--from OFFSET | --to-head) --yes
    manage.py queue gc
    manage.py queue health [--group G] [--topic T] [--json]
    manage.py queue pause (--group G | --topic T | --group G --topic T)
    manage.py queue resume (--group G | --topic T | --group G --topic T)
    manage.py queue pauses
    manage.py queue retire-group GROUP [--topic T] --yes
    manage.py queue cancel GROUP TOPIC (--id ID... | --partition KEY | --upto OFFSET) --yes
    manage.py queue archive DIR [--topic T]... [--batch-rows N] | --forget
    manage.py queue schedules [list] | run NAME | forget NAME

The verbs themselves are in sqlqueue.management.queue_verbs, one module per subject.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sqlqueue.exceptions import ConfigurationError
from sqlqueue.management.queue_verbs import (
    archive,
    dead_letters,
    pauses,
    repairs,
    schedules,
    status,
)
from sqlqueue.management.queue_verbs.arguments import add_verbs
from sqlqueue.management.queue_verbs.common import InertOutput, Verb
from sqlqueue.operations.preflight import ensure_ready

#: verb -> what runs it, once the database is ready (``health`` checks that itself)
VERBS: dict[str, Verb] = {
    "status": status.show_status,
    "retry-now": repairs.retry_waiting_now,
    "reset-position": repairs.move_position,
    "gc": repairs.collect_garbage_now,
    "pause": pauses.pause_or_resume,
    "resume": pauses.pause_or_resume,
    "pauses": pauses.list_pauses,
    "retire-group": repairs.retire,
    "cancel": repairs.cancel,
    "archive": archive.archive_or_forget,
    "schedules": schedules.schedules,
    "dead-letters": dead_letters.dead_letters,
}


class Command(BaseCommand):
    help = "Inspect and repair the queue: status and lag, dead letters, garbage collection."

    def add_arguments(self, parser: CommandParser) -> None:
        add_verbs(parser)

    def execute(self, *args: Any, **options: Any) -> Any:
        if options.get("verb") == "health":
            # The probe reports an unreachable database itself; the system checks would
            # end in a traceback first (the model checks of MySQL read its version).
            options["skip_checks"] = True
        return super().execute(*args, **options)

    def handle(self, *args: Any, **options: Any) -> None:
        # Everything printed, errors included, made inert (names, keys, errors, metadata).
        self.stdout, self.stderr = InertOutput(self.stdout), InertOutput(self.stderr)
        if options["verb"] == "health":
            status.check_health(self.stdout, options)  # reports an unready database itself
            return
        try:
            ensure_ready()  # unmigrated, or a latin1 connection: one line, exit 1
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        VERBS[options["verb"]](self.stdout, options)
