"""Stable names of the log events sqlqueue emits, with their structured fields.

Every event below is logged with ``extra=``: the record carries ``event`` (one of these
names) and the fields listed, as attributes, so a JSON formatter (python-json-logger,
structlog's stdlib bridge) prints them as keys. The message text is for people and may
change; the names and fields are kept stable (docs/guides/monitoring.md).
"""

from __future__ import annotations

from typing import Any

#: logger "sqlqueue.consumer", INFO: group, topic, subscriber, threads
RUNNER_STARTED = "sqlqueue.runner.started"
#: WARNING: error, delay (seconds before the next try)
RUNNER_RECONNECTING = "sqlqueue.runner.reconnecting"
#: DEBUG, each handler run: group, topic, partition, offset, attempt, outcome, duration
MESSAGE_HANDLED = "sqlqueue.message.handled"
#: DEBUG, each time a handler raised: group, topic, partition, offset, attempt, error,
#: subject
HANDLER_FAILED = "sqlqueue.handler.failed"
#: DEBUG, each dead letter: group, topic, partition, offset, attempt, reason, subject
MESSAGE_DEAD_LETTERED = "sqlqueue.message.dead_lettered"
#: WARNING, at most once per subscription per FAILURE_LOG_INTERVAL_SECONDS (the first
#: failure at once): group, topic, count (failures since the last such line), and the
#: latest's partition, offset, attempt, error, subject
HANDLER_FAILURES = "sqlqueue.handler.failures"
#: ERROR, the same for dead letters (error: the reason)
DEAD_LETTERS = "sqlqueue.messages.dead_lettered"
#: INFO: group, topic, subscriber, held, gained, lost, released
LEASES_CHANGED = "sqlqueue.leases.changed"
#: logger "sqlqueue.leases", DEBUG, each lease of a subscriber at each tick: group, topic,
#: partition, subscriber, change ("acquired", "renewed", "lost", "released"), generation,
#: tenure, age_ms (acquired, renewed: ms since the database last renewed it, by its own
#: clock, as the tick read it; None otherwise)
LEASE = "sqlqueue.lease"

#: ERROR, a watermark read lower than this process had seen it: group, topic, partition,
#: seen, now (an operator's reset-position, or writes the database lost)
WATERMARK_WENT_BACK = "sqlqueue.watermark.went_back"
#: ERROR, the log's offset counter read lower than before: seen, now, server (writes the
#: database lost: a failover to a replica that was behind, a restore)
OFFSET_COUNTER_WENT_BACK = "sqlqueue.offsets.counter_went_back"
#: WARNING, an operator asked this runner to stop (the admin, issue 42): subscriber,
#: action ("drain" or "stop"), requested_by, requested_at (epoch ms, database clock)
RUNNER_STOP_REQUESTED = "sqlqueue.runner.stop_requested"
#: WARNING, the database ended the runner's session after one of its transactions sat
#: idle past LEASE_DURATION (the process was frozen or blocked inside it): subscriber,
#: idle_ms
RUNNER_SESSION_ENDED = "sqlqueue.runner.session_ended"

EVENTS = (RUNNER_STARTED, RUNNER_RECONNECTING, MESSAGE_HANDLED, HANDLER_FAILED,
          MESSAGE_DEAD_LETTERED, HANDLER_FAILURES, DEAD_LETTERS, LEASES_CHANGED, LEASE,
          WATERMARK_WENT_BACK, OFFSET_COUNTER_WENT_BACK,
          RUNNER_STOP_REQUESTED, RUNNER_SESSION_ENDED)


def fields(event: str, **values: Any) -> dict[str, Any]:
    """The ``extra=`` of one event."""
    return {"event": event, **values}
