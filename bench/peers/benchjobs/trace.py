"""BENCH_TRACE=<dir>: timestamps along one message's path in a sqlqueue worker, for
finding where latency goes (issue 41). Off unless the variable is set; it patches the
runner's parts from outside (nothing in sqlqueue knows about it) and writes one JSON line
per event to ``<dir>/trace-<pid>.jsonl`` at exit.

Events (``time.time()``): ``ring`` (a wake-up heard), ``set`` (a handler's outcome woke
the main thread), ``wait`` (a wait between passes: start, end, timeout asked), ``cycle``
(a pass: start, end, the main thread's CPU seconds), ``stmt`` (each statement of the
main thread: start, end, its first words), ``commit`` (the pass's transaction committed, with the offsets it delivered),
``start`` / ``end`` (a handler thread started / finished an offset).
"""
import atexit
import json
import os
import threading
import time

_events = []
_lock = threading.Lock()


def _add(*event):
    with _lock:
        _events.append(event)


def _dump(directory):
    with open(os.path.join(directory, f"trace-{os.getpid()}.jsonl"), "w") as out:
        for event in _events:
            out.write(json.dumps(event) + "\n")


def experiment():
    """Knobs for A/B runs in one checkout: BENCH_NARROW=1|0: MySQL's polls ask which
    partitions have rows first (or not); BENCH_ADVANCES_WHILE_DELIVERING=N: watermarks a
    delivering pass moves (4 before issue 41's change); BENCH_MEMBERSHIP_RECHECK=S: how
    often a busy runner looks for members joining or leaving."""
    if os.environ.get("BENCH_ADVANCES_WHILE_DELIVERING"):
        from sqlqueue.consuming import watermarks

        watermarks.ADVANCES_WHILE_DELIVERING = int(
            os.environ["BENCH_ADVANCES_WHILE_DELIVERING"])
    if os.environ.get("BENCH_MEMBERSHIP_RECHECK"):
        from sqlqueue.consuming import subscriber

        subscriber.MEMBERSHIP_RECHECK = float(os.environ["BENCH_MEMBERSHIP_RECHECK"])
    if os.environ.get("BENCH_NARROW"):
        from sqlqueue.storage.sql.mysql import MySQLStore

        MySQLStore.narrows_fetches = os.environ["BENCH_NARROW"] == "1"


def install(directory):
    from django.db import connections

    from sqlqueue.consuming import handlers, runner, transactions
    from sqlqueue.wakeups import Doorbell

    def wrap(cls, name, before=None, after=None):
        original = getattr(cls, name)

        def patched(self, *args, **kwargs):
            t0 = time.time()
            result = original(self, *args, **kwargs)
            if after:
                after(self, t0, time.time(), args, result)
            return result

        setattr(cls, name, patched)

    wrap(Doorbell, "ring", after=lambda s, t0, t1, a, r: _add("ring", t0))
    wrap(Doorbell, "set", after=lambda s, t0, t1, a, r: _add("set", t0))
    wrap(Doorbell, "wait", after=lambda s, t0, t1, a, r: _add("wait", t0, t1, a[0]))

    def statement(execute, sql, params, many, context):
        t0 = time.time()
        try:
            return execute(sql, params, many, context)
        finally:
            _add("stmt", t0, time.time(), " ".join(str(sql).split()[:4])[:60])

    original_cycle = runner.Runner._cycle

    def cycle(self):
        t0, cpu0 = time.time(), time.thread_time()
        with connections[self.alias].execute_wrapper(statement):
            try:
                return original_cycle(self)
            finally:
                _add("cycle", t0, time.time(), time.thread_time() - cpu0)

    runner.Runner._cycle = cycle

    original_pass = transactions.FencedTransactions.deliver

    def one_pass(self, *args, **kwargs):
        deliveries = original_pass(self, *args, **kwargs)
        _add("commit", time.time(), [d.row.offset for d in deliveries])
        return deliveries

    transactions.FencedTransactions.deliver = one_pass

    original_handle = handlers.handle

    def handle(delivery):
        _add("start", time.time(), delivery.row.offset,
             json.loads(bytes(delivery.row.payload)).get("t"))
        try:
            return original_handle(delivery)
        finally:
            _add("end", time.time(), delivery.row.offset)

    handlers.handle = handle
    atexit.register(_dump, directory)
