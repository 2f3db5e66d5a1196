"""``MemoryStore``'s membership statements: leases with their fencing generation,
heartbeats, pauses, runner requests and the server record, with the semantics of
``sqlqueue.storage.statements.membership`` and ``failover`` (read them side by side)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sqlqueue.storage.sql.membership import LeaseRow
from tests.engine.memory.access import TableAccess
from tests.engine.memory.tables import HeartbeatRow, StoredLease

#: the server record's key in the leases table (statements.failover.SERVER_RECORD_KEY)
SERVER_RECORD = ("", "", "")


class MemoryMembership(TableAccess):
    """A part of ``MemoryStore``: ``LeaseStore`` and ``ControlStore``
    (``sqlqueue.storage.protocols``)."""

    # -- leases ------------------------------------------------------------------------------
    def acquire_leases(self, cursor: Any, group: str, topic: str, partitions: Sequence[str],
                       owner: str, duration_ms: int) -> None:
        """Free or expired (not renewed for ``duration_ms``) partitions become ``owner``'s,
        each under a new generation; a live lease stays whoever holds it."""
        t, now = self._tables("acquire_leases"), self._now()
        for partition in partitions:
            key = (group, topic, partition)
            lease = t.leases.get(key)
            if lease is None:
                t.leases[key] = StoredLease(owner, now, now, 1)
            elif lease.renewed_at < now - duration_ms:
                t.leases[key] = StoredLease(owner, now, now, lease.generation + 1)

    def renew_leases(self, cursor: Any, group: str, topic: str, owner: str,
                     held: Mapping[str, int]) -> int:
        """Extend the leases ``owner`` holds at the generation it holds them at, expired
        or not (nobody took an untouched row)."""
        t, now = self._tables("renew_leases"), self._now()
        renewed = 0
        for partition, generation in held.items():
            lease = t.leases.get((group, topic, partition))
            if lease is not None and lease.leased_by == owner and \
                    lease.generation == generation:
                t.leases[(group, topic, partition)] = dataclasses.replace(lease,
                                                                          renewed_at=now)
                renewed += 1
        return renewed

    def list_leases(self, cursor: Any, group: str, topic: str, *, lock: bool = False,
                    partitions: Sequence[str] | None = None) -> list[LeaseRow]:
        t, now = self._tables("list_leases"), self._now()
        return [(key[2], lease.leased_by, lease.generation, now - lease.renewed_at)
                for key, lease in sorted(t.leases.items())
                if key[:2] == (group, topic) and (partitions is None or key[2] in partitions)]

    def fence_leases(self, cursor: Any, group: str, topic: str, partitions: Sequence[str],
                     ) -> tuple[list[LeaseRow], str | None]:
        """``list_leases`` of ``partitions``; no lock to take: one transaction at a time."""
        rows = self.list_leases(cursor, group, topic, lock=True, partitions=partitions)
        return rows, (self.server_identity(cursor) if rows else None)

    def server_identity(self, cursor: Any) -> str:
        return ""  # one server, never failed over

    def is_lock_wait(self, error: BaseException) -> bool:
        return False  # no locks: one transaction at a time

    def release_leases(self, cursor: Any, group: str, topic: str, partitions: Sequence[str],
                       owner: str) -> int:
        if not partitions:
            return 0
        t = self._tables("release_leases")
        gone = [key for key, lease in t.leases.items() if key[:2] == (group, topic)
                and key[2] in partitions and lease.leased_by == owner]
        for key in gone:
            del t.leases[key]
        return len(gone)

    def purge_abandoned(self, cursor: Any, group: str, topic: str,
                        older_than_ms: int) -> None:
        t, now = self._tables("purge_abandoned"), self._now()
        for key in [k for k, lease in t.leases.items() if k[:2] == (group, topic)
                    and lease.renewed_at < now - older_than_ms]:
            del t.leases[key]
        for key in [k for k, beat in t.heartbeats.items() if k[:2] == (group, topic)
                    and beat.heartbeat_at < now - older_than_ms]:
            del t.heartbeats[key]

    # -- heartbeats --------------------------------------------------------------------------
    def heartbeat(self, cursor: Any, group: str, topic: str, name: str) -> None:
        self._tables("heartbeat").heartbeats[(group, topic, name)] = HeartbeatRow(self._now())

    def live_subscribers(self, cursor: Any, group: str, topic: str,
                         within_ms: int) -> list[str]:
        t, now = self._tables("live_subscribers"), self._now()
        return sorted(key[2] for key, beat in t.heartbeats.items()
                      if key[:2] == (group, topic) and beat.heartbeat_at >= now - within_ms
                      and beat.deregistered_at == 0)

    def deregister(self, cursor: Any, group: str, topic: str, name: str) -> None:
        self._tables("deregister").heartbeats.pop((group, topic, name), None)

    # -- flow control and runner requests -------------------------------------------------------
    def list_pauses(self, cursor: Any) -> list[tuple[str, str]]:
        return sorted(self._tables("list_pauses").pauses)

    def runner_request(self, cursor: Any, name: str) -> tuple[str, str, int] | None:
        request = self._tables("runner_request").runner_requests.get(name)
        if request is None or request[3] != 0:
            return None
        return request[0], request[1], request[2]

    def obey_runner_request(self, cursor: Any, name: str, requested_at: int) -> bool:
        t = self._tables("obey_runner_request")
        request = t.runner_requests.get(name)
        if request is None or request[2] != requested_at or request[3] != 0:
            return False
        t.runner_requests[name] = (*request[:3], self._now())
        return True

    # -- the server record (a failover) ------------------------------------------------------------
    def record_server(self, cursor: Any, server: str,
                      replacing: Sequence[str] | None = None) -> bool:
        t, now = self._tables("record_server"), self._now()
        record = t.leases.setdefault(SERVER_RECORD, StoredLease("", now, now, 0))
        named = record.leased_by
        if (named in replacing) if replacing is not None else named != server:
            t.leases[SERVER_RECORD] = dataclasses.replace(record, leased_by=server,
                                                          renewed_at=now)
            return True
        return False

    def void_grants(self, cursor: Any) -> tuple[int, int]:
        """Every lease expires under a new generation; no subscriber counts as alive;
        deliveries in flight without an error become visible."""
        t, now = self._tables("void_grants"), self._now()
        leases = 0
        for key, lease in list(t.leases.items()):
            if key[0] != SERVER_RECORD[0]:
                t.leases[key] = dataclasses.replace(lease, renewed_at=0,
                                                    generation=lease.generation + 1)
                leases += 1
        for member, beat in list(t.heartbeats.items()):
            if beat.heartbeat_at > 0:
                t.heartbeats[member] = dataclasses.replace(beat, heartbeat_at=0)
        deliveries = 0
        for delivery, state in list(t.states.items()):
            if not state.acked and state.last_error == "" and state.invisible_until > now:
                t.states[delivery] = dataclasses.replace(state, invisible_until=0)
                deliveries += 1
        return leases, deliveries
