"""The command line of ``manage.py queue``: its verbs and their options, in the order
``--help`` lists them."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandParser

from sqlqueue.operations.dead_letters import REPLAY_AT_MOST

MAX_LIST_LIMIT = 100_000


def list_limit(value: str) -> int:
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


def positive_count(value: str) -> int:
    """--at-most: a whole number of at least 1."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"--at-most is a whole number of at least 1; "
                                         f"got {value!r}")
    return number


def add_verbs(parser: CommandParser) -> None:
    """Every verb of ``manage.py queue`` and its options, as subparsers of ``parser``."""
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=type(parser))
    _add_status_and_health(verbs)
    _add_dead_letters(verbs, parser_class=type(parser))
    _add_repairs(verbs)
    _add_flow(verbs)
    _add_schedules(verbs)
    _add_retire_and_cancel(verbs)
    _add_archive(verbs)


def _add_status_and_health(verbs: Any) -> None:
    status = verbs.add_parser("status", help="Lag and status of every group and topic.")
    _filters(status)
    status.add_argument("--partitions", action="store_true",
                        help="One line per partition too.")
    health = verbs.add_parser(
        "health", help="Exit 0 when healthy, 1 when not: database unreachable, "
                       "migrations unapplied, a subscription in STOP or STALL.")
    _filters(health)
    health.add_argument("--json", action="store_true",
                        help="Print one JSON object: the verdict and its reasons.")
    health.add_argument("--liveness-file", metavar="FILE",
                        help="Only check that a runconsumer started with "
                             "--liveness-file FILE turned its loop lately (no database).")
    health.add_argument("--max-age", type=float, default=60.0, metavar="SECONDS",
                        help="With --liveness-file: the oldest last turn that is still "
                             "alive (default 60).")


def _add_dead_letters(verbs: Any, parser_class: type[CommandParser]) -> None:
    dead = verbs.add_parser("dead-letters", help="List, replay or discard dead letters.")
    actions = dead.add_subparsers(dest="action", required=True, parser_class=parser_class)
    listing = actions.add_parser("list", help="The newest dead letters.")
    _filters(listing)
    _database(listing, "every database the queue lives in")
    listing.add_argument("--limit", type=list_limit, default=50,
                         help=f"How many to list, 1 to {MAX_LIST_LIMIT} (default 50).")
    for name, text in (("replay", "Redeliver to the group that dead-lettered them."),
                       ("discard", "Delete for good.")):
        action = actions.add_parser(name, help=text)
        action.add_argument("offsets", nargs="*", type=int, metavar="OFFSET")
        action.add_argument("--all", action="store_true",
                            help="Every dead letter matching --group/--topic.")
        action.add_argument("--yes", action="store_true",
                            help="Confirm a bulk discard.")
        action.add_argument("--at-most", type=positive_count, default=REPLAY_AT_MOST,
                            help=f"With --all: at most this many, the oldest first "
                                 f"(default {REPLAY_AT_MOST}).")
        _filters(action)
        _database(action, "the --topic's, else SQLQUEUE['DATABASE']")


def _add_repairs(verbs: Any) -> None:
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
    gc = verbs.add_parser("gc", help="Delete what every known group has finished, now.")
    gc.add_argument("--share", type=_share, default=1.0, metavar="FRACTION",
                    help="Spend at most this part of the time deleting (0.5: pause after "
                         "each batch as long as it took), so that live traffic keeps its "
                         "latency beside a deep collection. Default 1: no pauses.")


def _share(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"a fraction above 0 and at most 1, not {text}")
    return value


def _add_flow(verbs: Any) -> None:
    for name, text in (
        ("pause", "Stop starting handlers for a group (on a topic or all of its topics), "
                  "or for every group of a topic; running handlers finish."),
        ("resume", "Remove a pause made with the same --group/--topic."),
    ):
        verb = verbs.add_parser(name, help=text)
        verb.add_argument("--group", help="The consumer group (all groups if omitted).")
        verb.add_argument("--topic", help="The topic (all of the group's if omitted).")
    verbs.add_parser("pauses", help="List the pauses in force.")


def _add_schedules(verbs: Any) -> None:
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


def _add_retire_and_cancel(verbs: Any) -> None:
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


def _add_archive(verbs: Any) -> None:
    archive = verbs.add_parser(
        "archive", help="Export finished messages to Parquet before garbage collection "
                        "(needs django-sqlqueue[spark]).")
    archive.add_argument("directory", nargs="?", metavar="DIR",
                         help="The archive (created if missing; resumed if it exists).")
    archive.add_argument("--topic", action="append", default=[],
                         help="Only this topic (repeat for more).")
    archive.add_argument("--batch-rows", type=int, default=100_000, metavar="N",
                         help="Rows per Parquet batch (default 100,000).")
    archive.add_argument("--forget", action="store_true",
                         help="Stop archiving: delete the archive's positions, so that "
                              "garbage collection no longer waits for it.")


def _database(parser: CommandParser, default: str) -> None:
    parser.add_argument("--database", metavar="ALIAS",
                        help=f"The database alias of the dead letters (default: {default}).")


def _filters(parser: CommandParser) -> None:
    parser.add_argument("--group", help="Only this consumer group.")
    parser.add_argument("--topic", help="Only this topic (the original topic for "
                                         "dead letters).")
