"""After a server change (a failover), the new primary serves at once: the leases and
deliveries the old server granted are void there, instead of being waited out
(``LEASE_DURATION``, ``VISIBILITY_TIMEOUT``).

Each database keeps a record of the server its leases and deliveries were granted by
(``sqlqueue.storage.statements.failover``). A runner records its server when it first
talks to it, before it takes any lease there; the first runner that notices a change from
the server the record names voids every lease, every heartbeat and every delivery in
flight, under the record's lock, and records the new server. Whoever comes later finds
the new server recorded and voids nothing: what was granted since is the new server's.

Nothing weakens. A voided lease expires under a new generation, so a subscriber still on
the old server, whose connection then reaches the new one, fails its fence and writes
nothing as owner (an atomic handler's ack checks its server too, guarantee I16); the voided
deliveries are delivered again (at least once). The voided heartbeats only say who is
alive for the fair shares: each subscriber that reaches the new server heartbeats at once,
and one that died with the old one no longer keeps a share of partitions unserved until
its heartbeat runs out. When the record names neither the runner's previous server nor
nobody (another runner recorded the new server first, or reaches it under another
address), nothing is voided and the old grants run out as before.
"""

from __future__ import annotations

import hashlib
import logging

from django.db import connections, transaction

from sqlqueue import storage

logger = logging.getLogger("sqlqueue.consumer")

#: what the record names before any runner recorded a server
NO_SERVER = ""


def server_key(identity: str) -> str:
    """The record's name for a server: a digest of its identity (address, port and start
    time on PostgreSQL), short enough for a subscriber-name column."""
    return "server " + hashlib.sha256(identity.encode()).hexdigest()[:32]


def record_first_server(alias: str, identity: str) -> None:
    """A runner's first contact with a server: the record names it from now on (voiding
    nothing: this runner knows of no earlier server). Nothing on SQLite (no identity)."""
    if not identity:
        return
    connection = connections[alias]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        storage.store(connection).record_server(cursor, server_key(identity))


def void_old_server(alias: str, before: str, now: str) -> tuple[int, int] | None:
    """This runner's connection moved from server ``before`` to ``now``: if the record
    still names ``before`` (or nobody), void what was granted there and record ``now``.
    Returns (leases, deliveries) voided, or None when another runner did it first or the
    record names another server."""
    if not (before and now):
        return None  # SQLite: no server
    connection = connections[alias]
    store = storage.store(connection)
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if not store.record_server(cursor, server_key(now),
                                     replacing=[server_key(before), NO_SERVER]):
            return None
        voided = store.void_grants(cursor)
    logger.warning("Voided %s lease(s) and %s delivery(ies) in flight granted by the old "
                   "server %r: the new server %r serves every partition at once.",
                   voided[0], voided[1], before, now)
    return voided
