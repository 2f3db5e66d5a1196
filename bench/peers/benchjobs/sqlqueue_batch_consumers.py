"""The no-op batch handler for sqlqueue (issue 55), registered as SPEC.md section 11 tells
users to: every message of a call recorded with one Redis RPUSH.

Imported only when BENCH_PEER=sqlqueue_batch (see benchjobs/apps.py).
"""
import sqlqueue

from .recorder import record_many

TOPIC = "benchpeers"
GROUP = "benchpeers-batch"
MAX_BATCH = 500


@sqlqueue.batch_consumer(TOPIC, group=GROUP, max_batch=MAX_BATCH)
def noop(messages):
    if messages:
        payloads = [m.payload for m in messages]
        record_many([(p["seq"], p["t"]) for p in payloads], payloads[0]["run"])
