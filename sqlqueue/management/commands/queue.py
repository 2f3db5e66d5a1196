"""``manage.py queue``: the operator's verbs, the same as the admin's actions.

    manage.py queue status [--group G] [--topic T] [--partitions]
    manage.py queue dead-letters list [--group G] [--topic T] [--limit N]
    manage.py queue dead-letters replay OFFSET... | --all [--group G] [--topic T]
    manage.py queue dead-letters discard OFFSET... | --all [--group G] [--topic T] --yes
    manage.py queue retry-now GROUP TOPIC [--partition KEY]
    manage.py queue reset-position GROUP TOPIC KEY (--from OFFSET | --to-head) --yes
    manage.py queue gc
    manage.py queue archive DIR [--topic T]... [--batch-rows N] | --forget
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sqlqueue.conf import get_settings
from sqlqueue.models import DeadLetter
from sqlqueue.operations.dead_letters import discard_dead_letters, replay_dead_letters
from sqlqueue.operations.lag import GroupLag, group_lag, known_subscriptions
from sqlqueue.operations.positions import InvalidPosition, reset_position, retry_now


class Command(BaseCommand):
    help = "Inspect and repair the queue: status and lag, dead letters, garbage collection."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True, parser_class=type(parser))
        status = verbs.add_parser("status", help="Lag and status of every group and topic.")
        self._filters(status)
        status.add_argument("--partitions", action="store_true",
                            help="One line per partition too.")
        dead = verbs.add_parser("dead-letters", help="List, replay or discard dead letters.")
        actions = dead.add_subparsers(dest="action", required=True,
                                      parser_class=type(parser))
        listing = actions.add_parser("list", help="The newest dead letters.")
        self._filters(listing)
        listing.add_argument("--limit", type=int, default=50)
        for name, text in (("replay", "Redeliver to the group that dead-lettered them."),
                           ("discard", "Delete for good.")):
            action = actions.add_parser(name, help=text)
            action.add_argument("offsets", nargs="*", type=int, metavar="OFFSET")
            action.add_argument("--all", action="store_true",
                                help="Every dead letter matching --group/--topic.")
            action.add_argument("--yes", action="store_true",
                                help="Confirm a bulk discard.")
            self._filters(action)
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
    def _filters(parser: CommandParser) -> None:
        parser.add_argument("--group", help="Only this consumer group.")
        parser.add_argument("--topic", help="Only this topic (the original topic for "
                                             "dead letters).")

    def handle(self, *args: Any, **options: Any) -> None:
        verb = options["verb"]
        if verb == "status":
            self._status(options)
        elif verb == "retry-now":
            self._retry_now(options)
        elif verb == "reset-position":
            self._reset_position(options)
        elif verb == "gc":
            self._gc()
        elif verb == "archive":
            self._archive(options)
        elif options["action"] == "list":
            self._list(options)
        else:
            self._act(options)

    # -- status ------------------------------------------------------------------------
    def _status(self, options: dict[str, Any]) -> None:
        subscriptions = [(g, t) for g, t in known_subscriptions()
                         if options["group"] in (None, g) and options["topic"] in (None, t)]
        if not subscriptions:
            self.stdout.write("No consumer group has registered yet.")
            return
        self.stdout.write(f"{'status':6}  {'group':20}  {'topic':28}  {'pending':>9}  "
                          f"{'dead':>6}  partitions")
        for group, topic in subscriptions:
            lag = group_lag(group, topic)
            self.stdout.write(f"{lag.status:6}  {group:20}  {topic:28}  "
                              f"{_count(lag.pending, lag):>9}  {lag.dead_letters:>6}  "
                              f"{len(lag.partitions)}")
            if options["partitions"]:
                for p in lag.partitions:
                    age = "-" if p.oldest_pending_age is None else f"{p.oldest_pending_age:.0f}s"
                    self.stdout.write(
                        f"    {p.status:6} {p.partition_key:24} head {p.head_offset} "
                        f"watermark {p.watermark} pending {p.pending} in flight "
                        f"{p.in_flight} retrying {p.retrying} oldest {age} "
                        f"held by {p.leased_by or '(nobody)'}"
                    )

    # -- dead letters --------------------------------------------------------------------
    def _dead_letters(self, options: dict[str, Any]) -> Any:
        rows = DeadLetter.objects.all()
        if options.get("group"):
            rows = rows.filter(consumer_group=options["group"])
        if options.get("topic"):
            rows = rows.filter(original_topic=options["topic"])
        return rows.order_by("-offset")

    def _list(self, options: dict[str, Any]) -> None:
        rows = list(self._dead_letters(options)[: max(1, options["limit"])])
        if not rows:
            self.stdout.write("No dead letters.")
            return
        for row in rows:
            first_line = (row.last_error.strip().splitlines() or [""])[-1][:100]
            detail = row.failure_detail if isinstance(row.failure_detail, dict) else {}
            self.stdout.write(
                f"{row.offset:>10}  {row.consumer_group}  {row.original_topic}/"
                f"{row.partition_key}  id={detail.get('id', row.id)}  "
                f"attempts={row.failure_count}  {first_line}"
            )

    def _act(self, options: dict[str, Any]) -> None:
        action = options["action"]
        if options["all"] and options["offsets"]:
            raise CommandError("Give offsets or --all, not both.")
        if options["all"]:
            if action == "discard" and not options["yes"]:
                raise CommandError("Discarding every matching dead letter deletes them for "
                                   "good: add --yes to confirm.")
            offsets = list(self._dead_letters(options).values_list("offset", flat=True))
        else:
            offsets = options["offsets"]
        if not offsets:
            raise CommandError("Nothing to do: give dead-letter offsets, or --all.")
        total = len(offsets)

        def progress(n: int) -> None:  # on long bulk operations
            if n % 100 == 0 or n == total:
                self.stdout.write(f"  {n}/{total}", ending="\n" if n == total else "\r")

        bulk = replay_dead_letters if action == "replay" else discard_dead_letters
        result = bulk(sorted(offsets), on_progress=progress)
        verb = "Replayed" if action == "replay" else "Discarded"
        self.stdout.write(f"{verb} {result.done} dead letter(s).")
        if result.missing:
            raise CommandError(
                f"No dead letter at offset(s) {', '.join(map(str, result.missing))}.")

    # -- repairs ---------------------------------------------------------------------------
    def _retry_now(self, options: dict[str, Any]) -> None:
        self._known(options["group"], options["topic"])
        count = retry_now(options["group"], options["topic"], options["partition"])
        self.stdout.write(f"{count} message(s) will be delivered again now.")

    def _reset_position(self, options: dict[str, Any]) -> None:
        self._known(options["group"], options["topic"])
        if not options["yes"]:
            raise CommandError("Resetting a position redelivers or skips messages: add --yes "
                               "to confirm.")
        try:
            moved = reset_position(options["group"], options["topic"], options["partition"],
                                   deliver_from=options["deliver_from"],
                                   to_head=options["to_head"])
        except InvalidPosition as error:
            raise CommandError(str(error)) from None
        self.stdout.write(moved.describe())

    @staticmethod
    def _known(group: str, topic: str) -> None:
        if (group, topic) not in known_subscriptions():
            raise CommandError(f"No consumer group {group!r} on topic {topic!r} (see "
                               "`manage.py queue status`).")

    # -- garbage collection ---------------------------------------------------------------
    def _gc(self) -> None:
        from django.db import connections

        from sqlqueue.consuming.gc import GarbageCollector

        conf = get_settings()
        topics: dict[str, set[str]] = {}
        for group, topic in known_subscriptions():
            topics.setdefault(topic, set()).add(group)
        collector = GarbageCollector(conf, conf.DATABASE, topics)
        total = 0
        with connections[conf.DATABASE].cursor() as cursor:
            while True:
                removed = collector.collect(cursor, force=True)
                total += removed
                if not removed:
                    break
                self.stdout.write(f"  deleted {total} so far", ending="\r")
        self.stdout.write(f"Deleted {collector.deleted} message(s) every known group had "
                          "finished.")
        if collector.results_deleted:
            self.stdout.write(f"Deleted {collector.results_deleted} task result(s) older than "
                              "their RESULT_RETENTION.")

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


def _count(value: int, lag: GroupLag) -> str:
    capped = any(p.pending_capped for p in lag.partitions)
    return f">={value}" if capped else str(value)
