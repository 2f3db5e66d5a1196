"""What each vendor builds its own way, on a Django connection: the database clock,
partition discovery and heads, the write horizon, garbage collection and the offset
counter. The statements are built once, in ``sqlqueue.storage.statements.vendors`` (and
PostgreSQL's overrides in ``statements.postgresql``); these methods run them."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.backends.utils import CursorWrapper

from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.sql.tables import VendorHooks


class VendorAccess(VendorHooks):
    """Mixin for ``Store``: the statements ``Vendor`` builds differently per database."""

    def database_now_ms(self, cursor: CursorWrapper) -> int:
        """``database_now_ms``: the database clock, epoch milliseconds."""
        cursor.execute(*self.sql.database_now_ms())
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])

    def discover_partitions(self, cursor: CursorWrapper, topic: str) -> list[str]:
        """``discover_partitions`` (sqlqueue.storage.statements.vendors)."""
        cursor.execute(*self.sql.discover_partitions(topic))
        return [r[0] for r in cursor.fetchall() if r[0] is not None]

    def partition_heads(self, cursor: CursorWrapper, topic: str) -> dict[str, int]:
        """``partition_heads`` (sqlqueue.storage.statements.vendors): partition -> newest
        offset."""
        cursor.execute(*self.sql.partition_heads(topic))
        return {r[0]: int(r[1]) for r in cursor.fetchall() if r[0] is not None}

    def write_horizon(self, cursor: CursorWrapper) -> WriteHorizon | None:
        """``write_horizon``: what the database shows of open transactions, for
        ``sqlqueue.horizon.settled_before`` (None: no transaction can commit out of offset
        order on this database). Read inside a started transaction."""
        raise NotImplementedError

    def offset_counter(self, cursor: CursorWrapper) -> int | None:
        """``offset_counter``: where the log's offset counter stands (None: unknown). It
        only grows: lower than before means the database lost writes."""
        cursor.execute(*self.sql.offset_counter())
        row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def delete_messages_upto(
        self, cursor: CursorWrapper, topic: str, partition: str, upto: int, limit: int
    ) -> int:
        """``delete_messages_upto``: garbage-collect the oldest rows of a partition, at most
        ``limit`` per statement (short transactions, short locks)."""
        cursor.execute(*self.sql.delete_messages_upto(topic, partition, upto, limit))
        return int(cursor.rowcount)

    def delete_messages_in_window(
        self, cursor: CursorWrapper, topic: str, after: int, upto: int,
        limits: Sequence[tuple[str, int]],
    ) -> int:
        """``delete_messages_in_window``: garbage-collect the rows of ``topic`` with
        after < offset <= upto, each at or below its partition's limit (``limits``:
        (partition, limit); a partition not named keeps its rows): a primary-key range,
        one statement."""
        if not limits:
            return 0
        cursor.execute(*self.sql.delete_messages_in_window(topic, after, upto, limits))
        return int(cursor.rowcount)

    def delete_expired_idempotency_keys(self, cursor: CursorWrapper, limit: int) -> int:
        """``delete_expired_idempotency_keys``: garbage-collect keys whose window has
        passed, at most ``limit`` per statement (idx_idempotency_expires)."""
        cursor.execute(*self.sql.delete_expired_idempotency_keys(limit))
        return int(cursor.rowcount)
