"""The queue's table names and keys, defined once for every executor (Django's, Spark's)."""

from __future__ import annotations

MESSAGE_TABLE = "queue_messages"
STATE_TABLE = "queue_delivery_state"
OFFSETS_TABLE = "queue_offsets"
LEASES_TABLE = "queue_partition_leases"
HEARTBEATS_TABLE = "queue_subscriber_heartbeats"
FLOW_CONTROL_TABLE = "queue_flow_control"
IDEMPOTENCY_TABLE = "queue_idempotency_keys"
SCHEDULES_TABLE = "queue_schedules"
TASK_RESULTS_TABLE = "queue_task_results"
RUNNER_REQUESTS_TABLE = "queue_runner_requests"
STORED_SCHEDULES_TABLE = "queue_stored_schedules"
MINUTE_STATS_TABLE = "queue_minute_stats"
GC_RUNS_TABLE = "queue_gc_runs"
#: every table ``migrate`` creates: the RFC's five, then sqlqueue's own eight
ALL_TABLES = (MESSAGE_TABLE, STATE_TABLE, LEASES_TABLE, OFFSETS_TABLE, HEARTBEATS_TABLE,
              TASK_RESULTS_TABLE, IDEMPOTENCY_TABLE, FLOW_CONTROL_TABLE, SCHEDULES_TABLE,
              RUNNER_REQUESTS_TABLE, STORED_SCHEDULES_TABLE, MINUTE_STATS_TABLE,
              GC_RUNS_TABLE)

#: the primary key of a delivery state row
STATE_KEY = ("consumer_group", "topic", "partition_key", "message_offset")
#: the primary key of a group's position (queue_offsets) and of a partition's lease
GROUP_KEY = ("consumer_group", "topic", "partition_key")
#: the unique key of a published message (idx_topic_partition_id)
MESSAGE_KEY = ("topic", "partition_key", "id")
#: the primary key of a subscriber's heartbeat
HEARTBEAT_KEY = ("consumer_group", "topic", "subscriber_name")
