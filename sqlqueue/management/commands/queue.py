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
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from sqlqueue.conf import get_settings
from sqlqueue.exceptions import ConfigurationError
from sqlqueue.models import DeadLetter
from sqlqueue.naming import escape_controls
from sqlqueue.operations import flow
from sqlqueue.operations.dead_letters import discard_dead_letters, replay_dead_letters
from sqlqueue.operations.health import HealthReport, queue_health, runner_alive
from sqlqueue.operations.lag import group_lag, known_subscriptions
from sqlqueue.operations.lag_shapes import GroupLag
from sqlqueue.operations.positions import InvalidPosition, reset_position, retry_now
from sqlqueue.operations.preflight import ensure_ready

MAX_LIST_LIMIT = 100_000


def _alias_of(topic: str) -> str:
    """The database a topic's messages and state live in (``SQLQUEUE["ROUTES"]``)."""
    return get_settings().alias_for(topic)


def _limit(value: str) -> int:
    """--limit: a whole number the database can take (argparse turns the error into a
    usage message and exit status 2)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_LIST_LIMIT:
        raise argparse.ArgumentTypeError(
            f"--limit is a whole number from 1 to {MAX_LIST_LIMIT:,}; got {value!r}")
    return number


class Command(BaseCommand):
    help = "Inspect and repair the queue: status and lag, dead letters, garbage collection."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True, parser_class=type(parser))
        status = verbs.add_parser("status", help="Lag and status of every group and topic.")
        self._filters(status)
        status.add_argument("--partitions", action="store_true",
                            help="One line per partition too.")
        health = verbs.add_parser(
            "health", help="Exit 0 when healthy, 1 when not: database unreachable, "
                           "migrations unapplied, a subscription in STOP or STALL.")
        self._filters(health)
        health.add_argument("--json", action="store_true",
                            help="Print one JSON object: the verdict and its reasons.")
        health.add_argument("--liveness-file", metavar="FILE",
                            help="Only check that a runconsumer started with "
                                 "--liveness-file FILE turned its loop lately (no database).")
        health.add_argument("--max-age", type=float, default=60.0, metavar="SECONDS",
                            help="With --liveness-file: the oldest last turn that is still "
                                 "alive (default 60).")
        dead = verbs.add_parser("dead-letters", help="List, replay or discard dead letters.")
        actions = dead.add_subparsers(dest="action", required=True,
                                      parser_class=type(parser))
        listing = actions.add_parser("list", help="The newest dead letters.")
        self._filters(listing)
        self._database(listing, "every database the queue lives in")
        listing.add_argument("--limit", type=_limit, default=50,
                             help=f"How many to list, 1 to {MAX_LIST_LIMIT} (default 50).")
        for name, text in (("replay", "Redeliver to the group that dead-lettered them."),
                           ("discard", "Delete for good.")):
            action = actions.add_parser(name, help=text)
            action.add_argument("offsets", nargs="*", type=int, metavar="OFFSET")
            action.add_argument("--all", action="store_true",
                                help="Every dead letter matching --group/--topic.")
            action.add_argument("--yes", action="store_true",
                                help="Confirm a bulk discard.")
            self._filters(action)
            self._database(action, "the --topic's, else SQLQUEUE['DATABASE']")
        retry = verbs.add_parser("retry-now", help="Deliver messages waiting on backoff now.")
        retry.add_argument("group")
        retry.add_argument("topic")
        retry.add_argument("--partition", help="Only this partition key.")
        reset = verbs.add_parser("reset-position",
                                 help="Rewind a group on a partition, or skip to its head.")
        reset.add_argument("group")
        reset.add_argument("topic")
        reset.add_argument("partition", metavar="KEY")
        where = reset.add_mutually_exclusive_group(required=True)
        where.add_argument("--from", dest="deliver_from", type=int, metavar="OFFSET",
                           help="Deliver every stored message from this offset on (again).")
        where.add_argument("--to-head", action="store_true",
                           help="Skip every message stored so far.")
        reset.add_argument("--yes", action="store_true", help="Confirm.")
        verbs.add_parser("gc", help="Delete what every known group has finished, now.")
        self._flow_verbs(verbs)
        archive = verbs.add_parser(
            "archive", help="Export finished messages to Parquet before garbage collection "
                            "(needs sqlqueue[spark]).")
        archive.add_argument("directory", nargs="?", metavar="DIR",
                             help="The archive (created if missing; resumed if it exists).")
        archive.add_argument("--topic", action="append", default=[],
                             help="Only this topic (repeat for more).")
        archive.add_argument("--batch-rows", type=int, default=100_000, metavar="N",
                             help="Rows per Parquet batch (default 100,000).")
        archive.add_argument("--forget", action="store_true",
                             help="Stop archiving: delete the archive's positions, so that "
                                  "garbage collection no longer waits for it.")

    @staticmethod
    def _flow_verbs(verbs: Any) -> None:
        for name, text in (
            ("pause", "Stop starting handlers for a group (on a topic or all of its topics), "
                      "or for every group of a topic; running handlers finish."),
            ("resume", "Remove a pause made with the same --group/--topic."),
        ):
            verb = verbs.add_parser(name, help=text)
            verb.add_argument("--group", help="The consumer group (all groups if omitted).")
            verb.add_argument("--topic", help="The topic (all of the group's if omitted).")
        verbs.add_parser("pauses", help="List the pauses in force.")
        schedules = verbs.add_parser(
            "schedules", help="List SQLQUEUE['SCHEDULES'] (next tick, last tick and how each "
                              "group fared with it), or publish one tick now.")
        actions = schedules.add_subparsers(dest="schedule_action", parser_class=type(schedules))
        actions.add_parser("list", help="The schedules (the default).")
        run = actions.add_parser("run", help="Publish one tick of a schedule now, besides "
                                             "its regular ticks.")
        run.add_argument("name")
        forget = actions.add_parser("forget", help="Delete what a schedule removed from the "
                                                   "settings left behind (its last tick).")
        forget.add_argument("name")
        retire = verbs.add_parser(
            "retire-group", help="Delete a group's positions, delivery state, leases, "
                                 "heartbeats and dead letters, so that garbage collection "
                                 "no longer waits for it.")
        retire.add_argument("group")
        retire.add_argument("--topic", help="Only on this topic (default: every topic).")
        retire.add_argument("--yes", action="store_true", help="Confirm.")
        cancel = verbs.add_parser("cancel", help="Settle pending messages of a group as "
                                                 "cancelled: they never run for it.")
        cancel.add_argument("group")
        cancel.add_argument("topic")
        cancel.add_argument("--id", action="append", default=[], dest="ids",
                            help="A message id (repeat for more).")
        cancel.add_argument("--partition", help="Only messages of this partition key.")
        cancel.add_argument("--upto", type=int, metavar="OFFSET",
                            help="Only messages at this offset or below.")
        cancel.add_argument("--reason", default="", help="Kept with the cancelled message.")
        cancel.add_argument("--yes", action="store_true", help="Confirm.")

    @staticmethod
    def _database(parser: CommandParser, default: str) -> None:
        parser.add_argument("--database", metavar="ALIAS",
                            help=f"The database alias of the dead letters (default: {default}).")

    @staticmethod
    def _filters(parser: CommandParser) -> None:
        parser.add_argument("--group", help="Only this consumer group.")
        parser.add_argument("--topic", help="Only this topic (the original topic for "
                                             "dead letters).")

    def execute(self, *args: Any, **options: Any) -> Any:
        if options.get("verb") == "health":
            # The probe reports an unreachable database itself; the system checks would
            # end in a traceback first (the model checks of MySQL read its version).
            options["skip_checks"] = True
        return super().execute(*args, **options)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["verb"] == "health":
            self._health(options)  # reports an unready database itself
            return
        try:
            ensure_ready()  # unmigrated, or a latin1 connection: one line, exit 1
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        verb = options["verb"]
        if verb == "status":
            self._status(options)
        elif verb == "retry-now":
            self._retry_now(options)
        elif verb == "reset-position":
            self._reset_position(options)
        elif verb == "gc":
            self._gc()
        elif verb in ("pause", "resume", "pauses"):
            self._flow(verb, options)
        elif verb == "retire-group":
            self._retire(options)
        elif verb == "cancel":
            self._cancel(options)
        elif verb == "archive":
            self._archive(options)
        elif verb == "schedules":
            self._schedules(options)
        elif options["action"] == "list":
            self._list(options)
        else:
            self._act(options)

    # -- status ------------------------------------------------------------------------
    def _status(self, options: dict[str, Any]) -> None:
        # Every database the queue lives in (SQLQUEUE["DATABASE"] and ROUTES' aliases).
        databases = get_settings().databases
        subscriptions = [(alias, g, t) for alias in databases
                         for g, t in known_subscriptions(alias)
                         if options["group"] in (None, g) and options["topic"] in (None, t)]
        if not subscriptions:
            self.stdout.write("No consumer group has registered yet.")
            return
        where = len(databases) > 1
        self.stdout.write(f"{'status':6}  {'group':20}  {'topic':28}  {'pending':>9}  "
                          f"{'dead':>6}  partitions" + ("  database" if where else ""))
        for alias, group, topic in subscriptions:
            lag = group_lag(group, topic, using=alias)
            self.stdout.write(f"{lag.status:6}  {group:20}  {topic:28}  "
                              f"{_count(lag.pending, lag):>9}  {lag.dead_letters:>6}  "
                              f"{len(lag.partitions):>10}" + (f"  {alias}" if where else ""))
            if options["partitions"]:
                for p in lag.partitions:
                    age = "-" if p.oldest_pending_age is None else f"{p.oldest_pending_age:.0f}s"
                    self.stdout.write(
                        f"    {p.status:6} {p.partition_key:24} head {p.head_offset} "
                        f"watermark {p.watermark} pending {p.pending} in flight "
                        f"{p.in_flight} retrying {p.retrying} oldest {age} "
                        f"held by {escape_controls(p.leased_by) or '(nobody)'}"
                    )

    # -- health ------------------------------------------------------------------------
    def _health(self, options: dict[str, Any]) -> None:
        report: HealthReport
        if options["liveness_file"]:
            report = runner_alive(options["liveness_file"], options["max_age"])
        else:
            report = queue_health(group=options["group"], topic=options["topic"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), sort_keys=True))
        else:
            self.stdout.write("healthy" if report.healthy else "unhealthy")
            for reason in report.reasons:
                self.stdout.write(escape_controls(f"  {reason}"))
        if not report.healthy:
            self.stdout.flush()
            sys.exit(1)

    # -- dead letters --------------------------------------------------------------------
    def _dead_letters(self, options: dict[str, Any], alias: str) -> Any:
        rows = DeadLetter.objects.using(alias).all()
        if options.get("group"):
            rows = rows.filter(consumer_group=options["group"])
        if options.get("topic"):
            rows = rows.filter(original_topic=options["topic"])
        return rows.order_by("-offset")

    def _list(self, options: dict[str, Any]) -> None:
        databases = ([self._alias(options["database"])] if options["database"]
                     else get_settings().databases)
        rows = [(alias, row) for alias in databases
                for row in self._dead_letters(options, alias)[: options["limit"]]]
        if not rows:
            self.stdout.write("No dead letters.")
            return
        for alias, row in rows:
            first_line = (row.last_error.strip().splitlines() or [""])[-1][:100]
            detail = row.failure_detail if isinstance(row.failure_detail, dict) else {}
            # Handler error text is anyone's: escape what a terminal would obey.
            self.stdout.write(escape_controls(
                f"{row.offset:>10}  {row.consumer_group}  {row.original_topic}/"
                f"{row.partition_key}  id={detail.get('id', row.id)}  "
                f"attempts={row.failure_count}  {first_line}"
                + (f"  [{alias}]" if len(databases) > 1 else "")
            ))

    def _act(self, options: dict[str, Any]) -> None:
        action = options["action"]
        alias = self._alias(options["database"] or (
            _alias_of(options["topic"]) if options["topic"] else None))
        if options["all"] and options["offsets"]:
            raise CommandError("Give offsets or --all, not both.")
        if options["all"]:
            if action == "discard" and not options["yes"]:
                raise CommandError("Discarding every matching dead letter deletes them for "
                                   "good: add --yes to confirm.")
            offsets = list(self._dead_letters(options, alias)
                           .values_list("offset", flat=True))
        else:
            offsets = options["offsets"]
        if not offsets:
            raise CommandError("Nothing to do: give dead-letter offsets, or --all.")
        total = len(offsets)

        def progress(n: int) -> None:  # on long bulk operations
            if n % 100 == 0 or n == total:
                self.stdout.write(f"  {n}/{total}", ending="\n" if n == total else "\r")

        bulk = replay_dead_letters if action == "replay" else discard_dead_letters
        result = bulk(sorted(offsets), on_progress=progress, using=alias)
        verb = "Replayed" if action == "replay" else "Discarded"
        self.stdout.write(f"{verb} {result.done} dead letter(s).")
        if result.missing:
            raise CommandError(
                f"No dead letter at offset(s) {', '.join(map(str, result.missing))}.")

    # -- repairs ---------------------------------------------------------------------------
    def _retry_now(self, options: dict[str, Any]) -> None:
        self._known(options["group"], options["topic"])
        count = retry_now(options["group"], options["topic"], options["partition"],
                          using=_alias_of(options["topic"]))
        self.stdout.write(f"{count} message(s) will be delivered again now.")

    def _reset_position(self, options: dict[str, Any]) -> None:
        self._known(options["group"], options["topic"])
        if not options["yes"]:
            raise CommandError("Resetting a position redelivers or skips messages: add --yes "
                               "to confirm.")
        try:
            moved = reset_position(options["group"], options["topic"], options["partition"],
                                   deliver_from=options["deliver_from"],
                                   to_head=options["to_head"],
                                   using=_alias_of(options["topic"]))
        except InvalidPosition as error:
            raise CommandError(str(error)) from None
        self.stdout.write(moved.describe())

    @staticmethod
    def _alias(alias: str | None) -> str:
        """``--database``, checked (None: SQLQUEUE["DATABASE"])."""
        if alias is None:
            return get_settings().DATABASE
        if alias not in connections.settings:
            raise CommandError(f"--database {alias!r} is not a database alias in DATABASES "
                               f"({', '.join(sorted(connections.settings))}).")
        return alias

    @staticmethod
    def _known(group: str, topic: str) -> None:
        if (group, topic) not in known_subscriptions(_alias_of(topic)):
            raise CommandError(f"No consumer group {group!r} on topic {topic!r} (see "
                               "`manage.py queue status`).")

    # -- flow control ----------------------------------------------------------------------
    def _flow(self, verb: str, options: dict[str, Any]) -> None:
        databases = get_settings().databases
        if verb == "pauses":
            rows = [row for alias in databases for row in flow.pauses(alias)]
            for row in rows:
                self.stdout.write(f"Paused: {row.describe()} (by {row.paused_by or '-'}).")
            if not rows:
                self.stdout.write("Nothing is paused.")
            return
        group, topic = options["group"], options["topic"]
        known = {pair for alias in databases for pair in known_subscriptions(alias)}
        if group and topic:
            self._known(group, topic)
        elif group and group not in {g for g, _ in known}:
            raise CommandError(f"No consumer group {group!r} (see `manage.py queue status`).")
        elif topic and topic not in {t for _, t in known}:
            raise CommandError(f"No consumer group on topic {topic!r} (see "
                               "`manage.py queue status`).")
        # A topic's pause lives where the topic does; a whole group's, everywhere.
        targets = [_alias_of(topic)] if topic else list(databases)
        try:
            # Every database is written (no short cut once one changed).
            if verb == "pause":
                changes = [flow.pause(group, topic, by="manage.py queue pause", using=alias)
                           for alias in targets]
            else:
                changes = [flow.resume(group, topic, using=alias) for alias in targets]
            changed = any(changes)
        except flow.InvalidPause as error:
            raise CommandError(str(error)) from None
        what = flow.PauseRow(group or "", topic or "", 0, "").describe()
        if verb == "pause":
            self.stdout.write(f"Paused {what}: running consumers start nothing new within "
                              "about a second." if changed else f"{what} was already paused.")
        elif changed:
            self.stdout.write(f"Resumed {what}.")
        else:
            raise CommandError(f"No pause of {what} (see `manage.py queue pauses`).")
        if verb == "resume" and (group and topic) and flow.is_paused(
                group, topic, using=_alias_of(topic)):
            self.stdout.write(f"Note: {group} on {topic} is still paused by a broader pause.")

    def _schedules(self, options: dict[str, Any]) -> None:
        from sqlqueue.operations.schedules import (
            UnknownSchedule,
            current_time_ms,
            forget_schedule,
            run_schedule_now,
            schedule_overview,
        )

        if options.get("schedule_action") == "forget":
            try:
                forgotten = forget_schedule(options["name"])
            except UnknownSchedule as error:
                raise CommandError(str(error)) from None
            if not forgotten:
                raise CommandError(f"No schedule {options['name']!r} is stored.")
            self.stdout.write(f"Forgot schedule {options['name']}.")
            return
        if options.get("schedule_action") == "run":
            try:
                tick = run_schedule_now(options["name"])
            except UnknownSchedule as error:
                raise CommandError(str(error)) from None
            self.stdout.write(f"Published a tick of {options['name']}: message "
                              f"{tick.message_id} at offset {tick.offset} on {tick.topic}.")
            return
        views = schedule_overview(current_time_ms())
        if not views:
            self.stdout.write("No schedules (SQLQUEUE['SCHEDULES'] is empty).")
        for view in views:
            row = view.row
            last = (f"last tick {_when(row.last_tick)} (offset {row.last_offset})"
                    if row and row.last_tick is not None else "no tick published yet")
            upcoming = (f"next {_when(view.next_tick_ms)}" if view.next_tick_ms is not None
                        else "publishes nothing")
            self.stdout.write(f"{escape_controls(view.name)}: {view.definition} -> "
                              f"{escape_controls(view.target)}; {upcoming}; {last}")
            for group, outcome in view.outcomes.items():
                self.stdout.write(f"    {escape_controls(group)}: {outcome}")

    def _retire(self, options: dict[str, Any]) -> None:
        from sqlqueue.operations.retire import CannotRetire, group_topics, retire_group

        group, topic = options["group"], options["topic"]
        if not options["yes"]:
            topics = [topic] if topic else group_topics(group, get_settings().DATABASE)
            raise CommandError(
                f"Retiring {group!r} deletes its positions, delivery state and dead letters "
                f"on {', '.join(topics) or 'no topic'} for good: add --yes to confirm.")

        def progress(table: str, done: int) -> None:
            self.stdout.write(f"  {table}: {done} deleted", ending="\r")

        try:
            retired = retire_group(group, topic, on_progress=progress,
                                   using=_alias_of(topic) if topic else None)
        except CannotRetire as error:
            raise CommandError(str(error)) from None
        self.stdout.write(retired.describe())

    def _cancel(self, options: dict[str, Any]) -> None:
        from sqlqueue.operations.cancel import InvalidCancel, cancel_messages

        if not options["yes"]:
            raise CommandError("Cancelled messages never run for the group: add --yes to "
                               "confirm.")
        try:
            result = cancel_messages(
                options["group"], options["topic"], ids=options["ids"],
                partition_key=options["partition"], upto_offset=options["upto"],
                reason=options["reason"], using=_alias_of(options["topic"]),
                on_progress=lambda n: self.stdout.write(f"  {n} cancelled", ending="\r"))
        except InvalidCancel as error:
            raise CommandError(str(error)) from None
        self.stdout.write(result.describe(options["group"], options["topic"]))

    # -- garbage collection ---------------------------------------------------------------
    def _gc(self) -> None:
        from sqlqueue.operations.gc import collect_garbage

        collected = collect_garbage(
            lambda total: self.stdout.write(f"  deleted {total} so far", ending="\r"))
        self.stdout.write(f"Deleted {collected.messages} message(s) every known group had "
                          "finished.")
        if collected.task_results:
            self.stdout.write(f"Deleted {collected.task_results} task result(s) older than "
                              "their RESULT_RETENTION.")
        if collected.idempotency_keys:
            self.stdout.write(f"Deleted {collected.idempotency_keys} idempotency key(s) past "
                              "IDEMPOTENCY_WINDOW.")

    # -- archive -------------------------------------------------------------------------
    def _archive(self, options: dict[str, Any]) -> None:
        try:
            from sqlqueue.integrations.spark import archive
        except ImportError as exc:
            raise CommandError(f"The archive needs pyarrow: pip install 'sqlqueue[spark]' "
                               f"({exc}).") from None
        if options["forget"]:
            deleted = archive.forget()
            self.stdout.write(f"Forgot the archive's position on {deleted} partition(s); "
                              "garbage collection no longer waits for it.")
            return
        if not options["directory"]:
            raise CommandError("Give the archive directory (or --forget).")
        if options["batch_rows"] < 1:
            raise CommandError("--batch-rows must be at least 1.")
        try:
            result = archive.archive(options["directory"], topics=options["topic"],
                                     batch_rows=options["batch_rows"],
                                     on_progress=lambda text: self.stdout.write(f"  {text}"))
        except archive.ArchiveError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(result.describe())
        if result.failed:
            raise CommandError("Not archived (the other topics were): " + "; ".join(
                f"{topic[:80]!r}: {why}" for topic, why in sorted(result.failed.items())))


def _when(epoch_ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="seconds")


def _count(value: int, lag: GroupLag) -> str:
    capped = any(p.pending_capped for p in lag.partitions)
    return f">={value}" if capped else str(value)
