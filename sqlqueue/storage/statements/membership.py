"""Named statements of membership: heartbeats, partition leases with their fencing
generation, the pauses a subscriber obeys, and an operator's request that a runner stop.
Each returns a ``Statement``; the executors run it (``sqlqueue.storage.sql.membership`` for
Django, the Spark consumer group for its own connections)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlqueue.storage.statements.tables import (
    FLOW_CONTROL_TABLE,
    GROUP_KEY,
    HEARTBEAT_KEY,
    HEARTBEATS_TABLE,
    LEASES_TABLE,
    RUNNER_REQUESTS_TABLE,
)
from sqlqueue.storage.statements.vendors import Statement, Vendor


class MembershipStatements(Vendor):
    """Heartbeats, leases and pauses, for any vendor (a mixin of ``Statements``)."""

    def _group_topic_sql(self) -> str:
        """``consumer_group = ? AND topic = ?``: the first two columns of every key here."""
        q = self.quote
        return (f"{q('consumer_group')} = {self.text_mark} "
                f"AND {q('topic')} = {self.text_mark}")

    # heartbeats ----------------------------------------------------------------------
    def heartbeat(self, group: str, topic: str, name: str) -> Statement:
        """``heartbeat``: this subscriber is alive (database time)."""
        q = self.quote
        columns = (*HEARTBEAT_KEY, "heartbeat_at", "deregistered_at")
        clause = self.upsert_clause(HEARTBEAT_KEY, {
            "heartbeat_at": f"{{new}}({q('heartbeat_at')})",
            "deregistered_at": "0",
        }, table=HEARTBEATS_TABLE)
        return (
            f"INSERT INTO {q(HEARTBEATS_TABLE)} ({self.names(columns)}) "
            f"VALUES (%s, %s, %s, {self.now_ms_sql}, 0) {clause}",
            [group, topic, name],
        )

    def live_subscribers(self, group: str, topic: str, within_ms: int) -> Statement:
        """``live_subscribers``: names with a heartbeat in the last ``within_ms``."""
        q = self.quote
        return (
            f"SELECT {q('subscriber_name')} FROM {q(HEARTBEATS_TABLE)} WHERE "
            f"{self._group_topic_sql()} AND "
            f"{q('heartbeat_at')} >= {self.now_ms_sql} - %s AND {q('deregistered_at')} = 0 "
            f"ORDER BY {q('subscriber_name')}",
            [group, topic, within_ms],
        )

    def deregister(self, group: str, topic: str, name: str) -> Statement:
        """``deregister``: a graceful goodbye, so the others rebalance at once."""
        q = self.quote
        return (
            f"DELETE FROM {q(HEARTBEATS_TABLE)} WHERE {self._group_topic_sql()} "
            f"AND {q('subscriber_name')} = {self.text_mark}",
            [group, topic, name],
        )

    # leases --------------------------------------------------------------------------
    def acquire_leases(self, group: str, topic: str, partitions: Sequence[str], owner: str,
                       duration_ms: int) -> Statement:
        """``acquire_leases``: take partitions that have no lease, or whose lease expired
        (not renewed for ``duration_ms`` by the database clock). A live lease is left
        alone, whoever holds it. Every change of owner increments ``generation``.
        ``partitions`` must not be empty."""
        q = self.quote
        now = self.now_ms_sql
        expired = f"{q('lease_renewed_at')} < {now} - %s"
        columns = (*GROUP_KEY, "leased_by", "leased_at", "lease_renewed_at", "generation")
        one = f"(%s, %s, %s, %s, {now}, {now}, 1)"
        clause = self.upsert_clause(GROUP_KEY, {
            # Every condition reads lease_renewed_at, which is assigned last.
            "generation": f"CASE WHEN {expired} THEN {q('generation')} + 1 "
                          f"ELSE {q('generation')} END",
            "leased_by": f"CASE WHEN {expired} THEN {{new}}({q('leased_by')}) "
                         f"ELSE {q('leased_by')} END",
            "leased_at": f"CASE WHEN {expired} THEN {now} ELSE {q('leased_at')} END",
            "lease_renewed_at": f"CASE WHEN {expired} THEN {now} "
                                f"ELSE {q('lease_renewed_at')} END",
        }, table=LEASES_TABLE)
        params: list[Any] = []
        for partition in partitions:
            params += [group, topic, partition, owner]
        params += [duration_ms] * 4  # the four CASE conditions
        return (
            f"INSERT INTO {q(LEASES_TABLE)} ({self.names(columns)}) "
            f"VALUES {', '.join([one] * len(partitions))} {clause}",
            params,
        )

    def renew_leases(self, group: str, topic: str, owner: str,
                     held: Mapping[str, int]) -> Statement:
        """``renew_leases``: extend the leases ``owner`` holds, each at the generation it
        holds it at (``held``: partition -> generation; must not be empty). A lease that
        expired while its holder stalled is extended too, as long as nobody took it:
        every change of owner, and a failover's voiding, changes the generation, so an
        untouched row means nobody else could have delivered from the partition since,
        and what the holder's handlers finished meanwhile is still its to record
        (guarantee I5, docs/reference/guarantees.md: never delivered again because the
        runner was slow to record it)."""
        q = self.quote
        partitions = sorted(held)
        only, keys = self.partitions_filter(partitions)
        generation_of = " ".join([f"WHEN {self.text_mark} THEN %s"] * len(partitions))
        return (
            f"UPDATE {q(LEASES_TABLE)} SET {q('lease_renewed_at')} = {self.now_ms_sql} "
            f"WHERE {self._group_topic_sql()}{only} "
            f"AND {q('leased_by')} = {self.text_mark} "
            f"AND {q('generation')} = CASE {q('partition_key')} {generation_of} END",
            [group, topic, *keys, owner,
             *(value for partition in partitions for value in (partition, held[partition]))],
        )

    def list_leases(self, group: str, topic: str, *, lock: bool = False,
                    partitions: Sequence[str] | None = None,
                    with_server: str = "") -> Statement:
        """``list_leases``: (partition, owner, generation, ms since renewal) of every lease
        of a (group, topic), or of ``partitions`` only; primary key. ``lock``: share-lock
        them until commit (fencing: the owner cannot change while this transaction writes
        as owner). ``with_server``: an expression of which server answered, read as a
        fifth column."""
        q = self.quote
        only, keys = self.partitions_filter(partitions)
        return (
            f"SELECT {q('partition_key')}, {q('leased_by')}, {q('generation')}, "
            f"{self.ms_since_sql(q('lease_renewed_at'))}"
            + (f", {with_server}" if with_server else "")
            + f" FROM {q(LEASES_TABLE)} "
            f"WHERE {self._group_topic_sql()}{only}"
            + (self.locking_read_suffix if lock else ""),
            [group, topic, *keys],
        )

    def release_leases(self, group: str, topic: str, owner: str,
                       partitions: Sequence[str] | None = None) -> Statement:
        """``release_leases``: give up the partitions ``owner`` holds (only those of
        ``partitions``, when given)."""
        q = self.quote
        only, keys = self.partitions_filter(partitions)
        return (
            f"DELETE FROM {q(LEASES_TABLE)} WHERE {self._group_topic_sql()} "
            f"AND {q('leased_by')} = {self.text_mark}{only}",
            [group, topic, owner, *keys],
        )

    def purge_abandoned(self, group: str, topic: str, older_than_ms: int,
                        ) -> tuple[Statement, Statement]:
        """``purge_abandoned``: forget leases and heartbeats nobody renewed for a long
        time (two statements). Runs long after such leases could be taken over, so the
        work of a dead subscriber is always recovered before it is forgotten."""
        q = self.quote
        now = self.now_ms_sql
        params: list[Any] = [group, topic, older_than_ms]
        return (
            (f"DELETE FROM {q(LEASES_TABLE)} WHERE {self._group_topic_sql()} "
             f"AND {q('lease_renewed_at')} < {now} - %s", params),
            (f"DELETE FROM {q(HEARTBEATS_TABLE)} WHERE {self._group_topic_sql()} "
             f"AND {q('heartbeat_at')} < {now} - %s", list(params)),
        )

    # flow control ----------------------------------------------------------------------
    def list_pauses(self) -> Statement:
        """``list_pauses``: every pause, as (group, topic); "" matches any. The table
        holds one row per pause an operator made (a handful), read whole."""
        q = self.quote
        return f"SELECT {q('consumer_group')}, {q('topic')} FROM {q(FLOW_CONTROL_TABLE)}", []

    # runner control (issue 42) ------------------------------------------------------------
    def runner_request(self, name: str) -> Statement:
        """``runner_request``: the request not yet obeyed that the runner ``name`` stop,
        as (action, requested_by, requested_at): one primary-key read."""
        q = self.quote
        return (
            f"SELECT {q('action')}, {q('requested_by')}, {q('requested_at')} FROM "
            f"{q(RUNNER_REQUESTS_TABLE)} WHERE {q('runner_name')} = {self.text_mark} AND "
            f"{q('obeyed_at')} = 0",
            [name],
        )

    def obey_runner_request(self, name: str, requested_at: int) -> Statement:
        """``obey_runner_request``: stamp the request read (database time); a newer one an
        operator made meanwhile (another ``requested_at``) stays to be read."""
        q = self.quote
        return (
            f"UPDATE {q(RUNNER_REQUESTS_TABLE)} SET {q('obeyed_at')} = {self.now_ms_sql} "
            f"WHERE {q('runner_name')} = {self.text_mark} AND {q('requested_at')} = %s AND "
            f"{q('obeyed_at')} = 0",
            [name, requested_at],
        )

    def record_runner_stop(self, name: str, action: str, cause: str, by: str,
                           stopped_ms_ago: int) -> Statement:
        """``record_runner_stop``: the runner ``name`` stopped for ``cause`` (not an
        operator's request: that row is the request's), told by ``by`` (``SIGTERM``) some
        ``stopped_ms_ago``; it has finished now (database time). Replaces its last row."""
        q = self.quote
        columns = ("runner_name", "action", "requested_by", "requested_at", "obeyed_at",
                   "cause")
        clause = self.upsert_clause(("runner_name",), {
            column: f"{{new}}({q(column)})" for column in columns[1:]
        }, table=RUNNER_REQUESTS_TABLE)
        now = self.now_ms_sql
        return (
            f"INSERT INTO {q(RUNNER_REQUESTS_TABLE)} ({self.names(columns)}) VALUES "
            f"({self.text_mark}, %s, {self.text_mark}, {now} - %s, {now}, %s) {clause}",
            [name, action, by, stopped_ms_ago, cause],
        )

    def forget_runner_stops(self, older_than_ms: int) -> Statement:
        """``forget_runner_stops``: the rows of runners that stopped (obeyed) more than
        ``older_than_ms`` ago; each process of a default name (host and pid) leaves one."""
        q = self.quote
        return (
            f"DELETE FROM {q(RUNNER_REQUESTS_TABLE)} WHERE {q('obeyed_at')} > 0 AND "
            f"{q('obeyed_at')} < {self.now_ms_sql} - %s",
            [older_than_ms],
        )
