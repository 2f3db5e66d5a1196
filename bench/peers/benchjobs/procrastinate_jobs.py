"""Procrastinate job (run by `manage.py procrastinate worker`), through its Django
integration: the task is registered on procrastinate.contrib.django's app.

Imported only when BENCH_PEER=procrastinate (PROCRASTINATE_IMPORT_PATHS in settings).
"""
from procrastinate.contrib.django import app

from .recorder import record


@app.task(name="benchpeers_noop", queue="benchpeers")
def noop(seq, t, run):
    record(seq, t, run)
