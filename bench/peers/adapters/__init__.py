"""Peer registry: name -> "module:Class" (imported lazily, so one broken peer can't break others)."""
import importlib

PEERS = {
    "tasks_db": "adapters.tasks_db:TasksDbAdapter",
    "django_q2": "adapters.django_q2:DjangoQ2Adapter",
    "celery": "adapters.celery_redis:CeleryAdapter",
    "dramatiq": "adapters.dramatiq_redis:DramatiqAdapter",
    "sqlqueue": "adapters.sqlqueue:SqlQueueAdapter",
    # the same, drained by a no-op batch consumer (max_batch=500)
    "sqlqueue_batch": "adapters.sqlqueue:SqlQueueBatchAdapter",
    "procrastinate": "adapters.procrastinate_pg:ProcrastinateAdapter",
    # no queue: the reference line for one INSERT per transaction
    "django_insert": "adapters.django_insert:DjangoInsertAdapter",
}


def load(name):
    mod, cls = PEERS[name].split(":")
    return getattr(importlib.import_module(mod), cls)()
