"""Procrastinate (PostgreSQL only) through its Django integration: `task.defer()` /
`task.batch_defer()` on Django's connection inside transaction.atomic(), and
`manage.py procrastinate worker` processes.

Its defaults, as its documentation recommends them: the worker LISTENs for the NOTIFY a
deferred job sends and polls every 5 s as a fallback; concurrency 1 (one job at a time per
process; a synchronous job runs in a thread). The harness's "min" poll setting lowers the
fallback polling interval.
"""
import importlib.util

from .base import Adapter

TABLES = ["procrastinate_jobs", "procrastinate_events", "procrastinate_periodic_defers"]


class ProcrastinateAdapter(Adapter):
    name = "procrastinate"
    dist = "procrastinate"
    supports_bulk = True
    bulk_note = "task.batch_defer(*kwargs): one multi-row INSERT per batch"
    poll = {"default": None, "min": 0.01}
    poll_note = ("LISTEN/NOTIFY (default on); fallback polling "
                 "--fetch-job-polling-interval, default 5 s")

    def available(self):
        if importlib.util.find_spec("procrastinate") is None:
            return False, "procrastinate is not installed"
        import os

        if os.environ.get("DB_ENGINE") != "postgresql":
            return False, "procrastinate runs on PostgreSQL only (DB_ENGINE=postgresql)"
        return True, ""

    def setup(self):
        from django.core.management import call_command

        call_command("migrate", "procrastinate", verbosity=0)

    def reset(self):
        from django.db import connection

        with connection.cursor() as c:
            c.execute("TRUNCATE TABLE " + ", ".join(TABLES) + " RESTART IDENTITY CASCADE")

    def enqueue_one(self, p):
        from benchjobs.procrastinate_jobs import noop

        noop.defer(seq=p["seq"], t=p["t"], run=p["run"])

    def enqueue_bulk(self, ps):
        from benchjobs.procrastinate_jobs import noop

        noop.batch_defer(*({"seq": p["seq"], "t": p["t"], "run": p["run"]} for p in ps))

    def queue_depth(self):
        from django.db import connection

        with connection.cursor() as c:
            c.execute("SELECT COUNT(*) FROM procrastinate_jobs WHERE status = 'todo'")
            return c.fetchone()[0]

    def worker_argvs(self, n, poll_value):
        argv = self.manage() + ["procrastinate", "worker", "--queues", "benchpeers"]
        if poll_value is not None:
            argv += ["--fetch-job-polling-interval", str(poll_value)]
        return [(argv, None) for _ in range(n)]

    def settings_info(self, n=None, poll=None):
        return {
            "worker": f"{n} x `manage.py procrastinate worker` process(es), concurrency 1",
            "listen_notify": True,
            "fetch_job_polling_interval_s": 5.0 if poll is None else poll,
        }
