"""``manage.py runconsumer``: run the registered consumers until stopped."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DatabaseError
from django.db import connections

from sqlqueue import __version__
from sqlqueue.conf import QueueSettings, get_settings
from sqlqueue.consuming import supervisor
from sqlqueue.consuming.control import RunnerControl, StopRecord
from sqlqueue.consuming.counter import OffsetCounterWatch
from sqlqueue.consuming.instruments import Instruments
from sqlqueue.consuming.registry import Consumer, select_consumers
from sqlqueue.consuming.rollup import MinuteRollup
from sqlqueue.consuming.runner import Runner
from sqlqueue.consuming.server import RECONNECT_BACKOFF
from sqlqueue.consuming.wakeups import describe_channels
from sqlqueue.exceptions import ConfigurationError
from sqlqueue.management.queue_verbs.common import InertOutput
from sqlqueue.naming import check_name
from sqlqueue.operations.preflight import ensure_ready
from sqlqueue.operations.runners import RunnerNameTaken, refuse_a_live_namesake
from sqlqueue.scheduling import configured_schedules
from sqlqueue.scheduling.stored import ReloadingTicker

#: where --metrics-port listens unless told otherwise: this host only (the metrics have no
#: authentication; docs/guides/monitoring.md says how to expose them)
DEFAULT_METRICS_HOST = "127.0.0.1"

logger = logging.getLogger("sqlqueue.consumer")


def start_banner(consumers: list[Consumer], conf: QueueSettings, alias: str,
                 who: str) -> list[str]:
    """What ``runconsumer`` found, printed once at start (docs/guides/consuming.md,
    "runconsumer"): the (group, topic) pairs it serves, the database and the wake-up
    channel, so that a newcomer sees at once whether it runs what they expect, where."""
    lines = [f"django-sqlqueue {__version__}: {who}",
             f"  database: {alias!r} ({connections[alias].vendor})",
             f"  wake-ups: {describe_channels(conf, alias)}",
             f"  consumers ({len(consumers)}):"]
    lines += [f"    group {c.group!r} on topic {c.topic!r}"
              + (f" (batch consumer, max_batch {c.max_batch})" if c.max_batch else "")
              for c in consumers]
    return lines


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def _positive_float(value: str) -> float:
    number = float(value)
    if not 0 < number < float("inf"):
        raise ValueError(value)
    return number


#: Options of the supervisor itself, never passed to its workers.
SUPERVISOR_OPTIONS = ("processes", "max_messages_per_child", "max_memory", "stuck_grace")


def _settings_for(alias: str | None) -> QueueSettings:
    conf = get_settings()
    if alias is None:
        return conf
    if alias not in connections.settings:
        raise ConfigurationError(
            f"--database {alias!r} is not a database alias in DATABASES "
            f"(known: {', '.join(connections.settings)}).")
    return dataclasses.replace(conf, DATABASE=alias)


def _subscriber_name(value: str) -> str:
    """--name: stored in heartbeats and leases and shown to operators; argparse turns the
    error into a usage message and exit status 2."""
    try:
        return check_name("--name", value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _python_entry() -> list[str]:
    """How this process was started (manage.py, django-admin), to start workers alike;
    the settings module comes with the environment (DJANGO_SETTINGS_MODULE)."""
    main = sys.argv[0] if sys.argv else ""
    if main and os.path.isfile(main) and os.path.basename(main) != "__main__.py":
        return [sys.executable, main]
    return [sys.executable, "-m", "django"]


def refuse_inside_a_transaction() -> None:
    """A consumer started inside an open transaction (a ``django.test.TestCase``, an
    ``atomic()`` block around ``call_command``) would hand messages to handler threads on
    other connections, which wait on that transaction's locks or never see its rows:
    refuse at once, before any statement, and say what to use instead. Only connections
    already open are looked at (nothing connects; no setting is read: a bad one is the
    system checks' to report)."""
    for connection in connections.all(initialized_only=True):
        in_transaction = connection.in_atomic_block or (
            connection.connection is not None and not connection.autocommit)
        if in_transaction:
            raise CommandError(
                f"runconsumer cannot run inside an open transaction on database "
                f"{connection.alias!r} (a django.test.TestCase, or transaction.atomic() "
                "around call_command): its handler threads would wait on that "
                "transaction's locks. In tests, use sqlqueue.testing.run_consumers(), which "
                "runs the consumers inside it (docs/guides/testing.md of django-sqlqueue).")


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
        parser.add_argument("--name", type=_subscriber_name,
                            help="Subscriber name (default: hostname-pid); the rule of "
                                 "topic names: printable, 1 to 255 UTF-8 bytes.")
        parser.add_argument("--until-empty", action="store_true",
                            help="Exit once nothing is deliverable, in flight or retrying.")
        parser.add_argument("--max-messages", type=_positive,
                            help="Exit after handling this many messages.")
        parser.add_argument("--database", metavar="ALIAS",
                            help="Consume the queue tables of this database alias "
                                 "(default: SQLQUEUE['DATABASE']).")
        parser.add_argument("--metrics-port", type=int, metavar="PORT",
                            help="Serve this process's Prometheus counters and histograms "
                                 "on PORT (needs django-sqlqueue[metrics]; one port per process).")
        parser.add_argument("--metrics-host", "--metrics-address", dest="metrics_address",
                            default=DEFAULT_METRICS_HOST, metavar="ADDRESS",
                            help="Listen address of --metrics-port (default: 127.0.0.1, "
                                 "this host only; 0.0.0.0 for every interface, behind a "
                                 "firewall: the metrics have no authentication).")
        parser.add_argument("--liveness-file", metavar="FILE",
                            help="Touch FILE at each turn of the consumer loop (a liveness "
                                 "probe: manage.py queue health --liveness-file FILE).")
        parser.add_argument("--no-schedules", action="store_true",
                            help="Do not publish the ticks of SQLQUEUE['SCHEDULES'] from this "
                                 "process (by default every runconsumer does; each tick is "
                                 "published once however many run).")
        supervising = parser.add_argument_group("supervisor (--processes)")
        supervising.add_argument(
            "--processes", type=_positive, metavar="N",
            help="Run N worker processes under a supervisor that restarts crashed ones, "
                 "recycles them and forwards signals; with --name, worker i is NAME-i, "
                 "with --metrics-port P, it serves on P+i.")
        supervising.add_argument(
            "--max-messages-per-child", type=_positive, metavar="N",
            help="Replace a worker after it handled N messages.")
        supervising.add_argument(
            "--max-memory", type=_positive_float, metavar="MB",
            help="Replace a worker (gracefully) once its resident memory passes MB (Linux).")
        supervising.add_argument(
            "--stuck-grace", type=_positive_float, metavar="SECONDS", default=60.0,
            help="Replace a worker whose handler is still running this long after its "
                 "consumer's timeout= (default: 60).")
        # Given by the supervisor to its workers only.
        parser.add_argument("--supervisor-lifeline", type=int, help=argparse.SUPPRESS)
        parser.add_argument("--exit-when-stuck", type=float, help=argparse.SUPPRESS)

    def execute(self, *args: Any, **options: Any) -> Any:
        # The system checks run in handle(), where a database that is not reachable yet
        # (a server restarting, a container starting) is waited for instead of ending
        # the process in a traceback: MySQL's model checks ask the server its version.
        run_checks = not options.get("skip_checks")
        options["skip_checks"] = True
        options["_run_checks"] = run_checks
        return super().execute(*args, **options)

    def _checks_when_reachable(self) -> None:
        self._when_reachable(self.check)

    @staticmethod
    def _when_reachable(step: Callable[[], None]) -> None:
        """Run ``step``, which asks the database, again until the database answers (a
        server restarting or starting is waited for, not a traceback and exit 1)."""
        for attempt in itertools.count():
            try:
                step()
                return
            except DatabaseError as exc:
                delay = RECONNECT_BACKOFF[min(attempt, len(RECONNECT_BACKOFF) - 1)]
                logger.warning("The database is not reachable yet (%s); checking again in "
                               "%.1fs.", exc, delay)
                for connection in connections.all():
                    connection.close()
                time.sleep(delay)

    def handle(self, *args: Any, **options: Any) -> None:
        refuse_inside_a_transaction()
        self.stdout, self.stderr = InertOutput(self.stdout), InertOutput(self.stderr)
        if options.get("_run_checks", True):
            self._checks_when_reachable()
        if options["processes"] is not None:
            self._supervise(options)
            return
        self._check_supervisor_options(options)
        instruments = self._instruments(options)
        try:
            consumers = select_consumers(options["group"], options["topic"])
            self._preflight()
            runner = Runner(
                consumers,
                conf=_settings_for(options["database"]),
                threads=options["threads"],
                name=options["name"],
                until_empty=options["until_empty"],
                max_messages=options["max_messages"],
                liveness_file=options["liveness_file"],
                instruments=instruments,
                exit_when_stuck=options["exit_when_stuck"],
            )
            # One runner per name: the name is how leases, heartbeats and stop requests
            # tell runners apart.
            # (It asks the database: one not reachable yet is waited for.)
            self._when_reachable(
                lambda: refuse_a_live_namesake(runner.name, using=runner.alias))
            runner.pacer.add_timer(OffsetCounterWatch(runner.alias, runner.clock.now_ms))
            control = RunnerControl.of(runner)  # the admin's stop requests
            runner.pacer.add_timer(control)
            rollup = MinuteRollup.of(runner)  # the admin's live overview
            runner.pacer.add_timer(rollup)
            if not options["no_schedules"]:
                # The setting's schedules and the stored ones (reloaded every few seconds:
                # the admin may add one at any time).
                runner.pacer.add_timer(ReloadingTicker(configured_schedules(),
                                                     runner.clock.now_ms))
        except (ConfigurationError, RunnerNameTaken) as exc:
            raise CommandError(str(exc)) from exc
        if options["verbosity"] >= 2:
            logging.getLogger("sqlqueue").setLevel(logging.DEBUG)
        # Before anything is printed: a Ctrl-C that follows the banner at once (a user, a
        # script waiting for it) ends the process cleanly, not with a traceback.
        runner.install_signal_handlers()
        stopped = StopRecord(runner.name, runner.alias, runner.host_clock)  # why, for the admin
        stopped.watch_signals()
        if options["verbosity"] >= 1 and options["supervisor_lifeline"] is None:
            self.stdout.write("\n".join(start_banner(
                [s.consumer for s in runner.subscribers], runner.conf, runner.alias,
                f"subscriber {runner.name}, {runner.threads} handler thread(s)")))
        if options["supervisor_lifeline"] is not None:
            supervisor.attach(options["supervisor_lifeline"],
                              stopped.noting_supervisor_gone(runner.stop), stopped.recycled)
        status = runner.run(install_signal_handlers=False)
        rollup.flush()  # the last seconds' counts
        stopped.write(runner, control)
        if options["verbosity"] >= 1:
            self._report(runner)
        if options["supervisor_lifeline"] is not None and runner.reached_max_messages:
            status = status or supervisor.EXIT_RECYCLE
        if status:
            sys.exit(status)

    # -- the supervisor (--processes) ---------------------------------------------------------
    @staticmethod
    def _check_supervisor_options(options: dict[str, Any]) -> None:
        given = [f"--{name.replace('_', '-')}" for name in SUPERVISOR_OPTIONS[1:3]
                 if options[name] is not None]
        if given:
            raise CommandError(f"{' and '.join(given)} need --processes.")

    def _supervise(self, options: dict[str, Any]) -> None:
        """Check once what every worker would check, then run the workers."""
        if options["max_messages"] is not None:
            raise CommandError("--max-messages counts one process's messages: with "
                               "--processes, use --max-messages-per-child.")
        if options["max_memory"] is not None and not sys.platform.startswith("linux"):
            raise CommandError("--max-memory reads /proc: it needs Linux.")
        if options["name"] is not None:
            try:
                _subscriber_name(f"{options['name']}-{options['processes'] - 1}")
            except argparse.ArgumentTypeError as exc:
                raise CommandError(f"--name with --processes: {exc}") from None
        if options["metrics_port"] is not None and not (
                0 < options["metrics_port"] <= 65536 - options["processes"]):
            raise CommandError(f"--metrics-port {options['metrics_port']}: the workers' "
                               f"ports P to P+{options['processes'] - 1} must be valid.")
        try:
            consumers = select_consumers(options["group"], options["topic"])
            conf = _settings_for(options["database"])
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        self._preflight()
        if options["verbosity"] >= 1:
            self.stdout.write("\n".join(start_banner(
                consumers, conf, conf.DATABASE,
                f"{options['processes']} worker process(es) under a supervisor")))
        status = supervisor.Supervisor(
            lambda slot, lifeline: self._worker_command(options, slot, lifeline),
            options["processes"], until_empty=options["until_empty"],
            max_memory_mb=options["max_memory"], shutdown_timeout=conf.SHUTDOWN_TIMEOUT,
        ).run()
        if status:
            sys.exit(status)

    def _worker_command(self, options: dict[str, Any], slot: int, lifeline: int) -> list[str]:
        """The same runconsumer, less the supervisor's options, as worker ``slot``."""
        # The supervisor ran the system checks already: --skip-checks saves each worker
        # (and each replacement) their start-up cost.
        args = [*_python_entry(), "runconsumer", "--supervisor-lifeline", str(lifeline),
                "--exit-when-stuck", str(options["stuck_grace"]),
                "--verbosity", str(options["verbosity"]), "--skip-checks"]
        for flag in ("group", "topic"):
            for value in options[flag]:
                args += [f"--{flag}", value]
        if options["name"] is not None:
            args += ["--name", f"{options['name']}-{slot}"]
        if options["metrics_port"] is not None:
            args += ["--metrics-port", str(options["metrics_port"] + slot),
                     "--metrics-host", options["metrics_address"]]
        if options["max_messages_per_child"] is not None:
            args += ["--max-messages", str(options["max_messages_per_child"])]
        for flag in ("threads", "database", "liveness_file", "pythonpath"):
            if options.get(flag) is not None:
                args += [f"--{flag.replace('_', '-')}", str(options[flag])]
        for flag in ("until_empty", "no_schedules", "traceback", "no_color", "force_color"):
            if options.get(flag):
                args.append(f"--{flag.replace('_', '-')}")
        return args

    def _preflight(self) -> None:
        """Unmigrated, or a latin1 connection: one line and exit 1, not a retry loop. A
        database that is not reachable yet is the runner's to wait for (it reconnects)."""
        try:
            ensure_ready()
        except DatabaseError as exc:
            logger.warning("Could not check the queue's database before starting (%s); "
                           "starting anyway.", exc)

    @staticmethod
    def _instruments(options: dict[str, Any]) -> Instruments | None:
        port = options["metrics_port"]
        if port is None:
            return None
        if not 0 < port < 65536:
            raise CommandError(f"--metrics-port must be between 1 and 65535, not {port}.")
        try:
            from sqlqueue.metrics import ProcessMetrics
        except ImportError as exc:
            raise CommandError("--metrics-port needs prometheus_client: pip install "
                               "'django-sqlqueue[metrics]'.") from exc
        metrics = ProcessMetrics()
        try:
            metrics.serve(port, options["metrics_address"])
        except OSError as exc:
            raise CommandError(f"--metrics-port {port}: {exc.strerror}.") from exc
        return metrics

    def _report(self, runner: Runner) -> None:
        for subscriber in runner.subscribers:
            s = subscriber.stats
            self.stdout.write(
                f"{subscriber.consumer.name}: {s['acked']} acked, {s['retried']} retried, "
                f"{s['dead_lettered']} dead-lettered"
            )
        if runner.exit.behind:
            # The watermark stayed behind this run's acks: garbage collection keeps their
            # rows until the group runs again (docs/guides/operations.md).
            self.stdout.write(
                f"Watermark left behind the acks of {', '.join(runner.exit.behind)}: "
                "their rows are not settled, a publishing transaction may still be open"
                + ("" if runner.exit.held_by is None else
                   f"; the write horizon waits for {runner.exit.held_by.describe()}"))
