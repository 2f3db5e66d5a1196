"""A failover on a Django connection: the record of which server the queue runs on, and
voiding what the old server granted. The statements are built once, in
``sqlqueue.storage.statements.failover``; these methods run them."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import VendorHooks


class FailoverAccess(VendorHooks):
    """Mixin for ``Store``: the server record and the voiding of grants."""

    def record_server(self, cursor: CursorWrapper, server: str,
                      replacing: Sequence[str] | None = None) -> bool:
        """``ensure_server_record`` then ``record_server``: did the record change to name
        ``server`` (it named one of ``replacing``, or any other server when not given)?
        The record stays locked until commit."""
        cursor.execute(*self.sql.ensure_server_record())
        cursor.execute(*self.sql.record_server(server, replacing))
        return int(cursor.rowcount) == 1

    def void_grants(self, cursor: CursorWrapper) -> tuple[int, int]:
        """``void_leases``, ``void_heartbeats`` and ``void_deliveries``: how many leases
        and deliveries of the old server were voided."""
        cursor.execute(*self.sql.void_leases())
        leases = int(cursor.rowcount)
        cursor.execute(*self.sql.void_heartbeats())
        cursor.execute(*self.sql.void_deliveries())
        return leases, int(cursor.rowcount)
