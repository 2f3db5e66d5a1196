import os

from django.apps import AppConfig


class BenchJobsConfig(AppConfig):
    name = "benchjobs"

    def ready(self):
        # Only sqlqueue needs handlers registered at start-up; the other peers'
        # environments need not have it installed.
        peer = os.environ.get("BENCH_PEER")
        if peer == "sqlqueue_batch":
            from . import sqlqueue_batch_consumers  # noqa: F401
        if peer == "sqlqueue":
            from . import sqlqueue_consumers  # noqa: F401

            from . import trace

            trace.experiment()
            if os.environ.get("BENCH_TRACE"):
                trace.install(os.environ["BENCH_TRACE"])
