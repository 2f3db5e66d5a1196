"""The history of an acceptance run across a failover, for the history checker
(tests/history): what the publisher printed, what the workers' handlers and lease keepers
wrote to files of their own (which outlive the servers), the faults the test made, and
what the surviving server holds. Shared by test_async_failover.py and test_patroni.py.

A worker started with ``history_env(folder, name)`` appends each handler run of the
``failover`` group (``tests/testapp/consumers.py``) to ``runs-NAME.jsonl`` and its lease
events to ``leases-NAME.jsonl`` (``tests/settings.py``'s LOGGING, ``LeaseLines``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.history import lease_log
from tests.history.model import Fault, GroupConfig, History, Publish, runs_from_lines


def history_env(folder: Path, name: str) -> dict[str, str]:
    """The environment that makes worker ``name`` record its runs and lease events."""
    return {"SQLQUEUE_TEST_RUNS": str(folder / f"runs-{name}.jsonl"),
            "SQLQUEUE_TEST_LEASE_EVENTS": str(folder / f"leases-{name}.jsonl"),
            "SQLQUEUE_TEST_RUNNER": name}


def publishes_from(lines: str, topic: str,
                   in_doubt: Callable[[str], int | None]) -> list[Publish]:
    """The publisher's lines "ok ID PARTITION OFFSET BEGAN_MS ENDED_MS" (committed: its
    commit returned) and "failed ID PARTITION - BEGAN_MS ENDED_MS" (the failover: committed
    if ``in_doubt(id)`` finds its offset, on the surviving server or in a run: the
    database decided)."""
    found = []
    for line in lines.splitlines():
        fields = line.split()
        if len(fields) != 6 or fields[0] not in ("ok", "failed"):
            continue
        kind, message_id, partition, offset, began, ended = fields
        known = int(offset) if kind == "ok" else in_doubt(message_id)
        found.append(Publish("publisher", topic, partition, message_id, known, float(began),
                             float(began), float(ended), kind == "ok" or known is not None))
    return found


def across_a_failover(folder: Path, topic: str, group: str, config: GroupConfig,
                      published: str, faults: list[Fault], sql: Callable[[str], str],
                      lease_ms: int, renew_ms: int) -> History:
    """The history: ``sql`` runs a statement on the surviving server (rows of
    whitespace-separated fields). Publishes the surviving server lost are in it, as
    committed (their commit returned): the checker excuses what a failover lost."""
    history = History(topic, {group: config}, faults=list(faults), lease_ms=lease_ms,
                      renew_ms=renew_ms)
    for path in sorted(folder.glob("runs-*.jsonl")):
        history.runs += runs_from_lines(path.read_text().splitlines())
    lease_log.read_lines(sorted(folder.glob("leases-*.jsonl")), history)
    history.final.stored = {
        (partition, int(offset)): message_id for message_id, partition, offset in _rows(sql(
            f"SELECT id, partition_key, `offset` FROM queue_messages WHERE topic = '{topic}'"))}
    offsets = {i: o for (_, o), i in history.final.stored.items()}
    offsets.update({r.id: r.offset for r in history.runs if r.id not in offsets})
    history.publishes = publishes_from(published, topic, offsets.get)
    watermarks = {partition: int(offset) for partition, offset in _rows(sql(
        "SELECT partition_key, offset_acked FROM queue_offsets WHERE "
        f"consumer_group = '{group}' AND topic = '{topic}'"))}
    acked = {(partition, int(offset)) for partition, offset in _rows(sql(
        "SELECT partition_key, message_offset FROM queue_delivery_state WHERE "
        f"consumer_group = '{group}' AND topic = '{topic}' AND acked"))}
    history.final.acked = {(group, p, o) for p, o in history.final.stored
                           if (p, o) in acked or o <= watermarks.get(p, 0)}
    return history


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]
