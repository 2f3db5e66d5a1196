"""Which offsets are settled: no row can still appear below them (late commits, guarantee I4).

Offsets come from AUTO_INCREMENT when a row is inserted, but the row becomes visible when
its transaction commits, so a message can appear *below* offsets already visible. The
consumer engine and the stream use the same rule (``sqlqueue.horizon``): a row inserted
(``created_at``, the database clock) before the oldest open writing transaction started is
settled, minus a second of margin. Without the PROCESS privilege the oldest open
transaction is unknown and assumed to be MAX_TRANSACTION_AGE old. SQLite has one writer at
a time: every visible row is settled.

INNODB_TRX is a server-wide snapshot that InnoDB refreshes only when nobody has read it
for 0.1 s: with many readers it can stay stale, and miss transactions that began after it
was taken. It is read inside a transaction of our own (``begin_snapshot_sql``, which
InnoDB lists at once), so a fresh snapshot lists it; a stale one lists only older
transactions, which bounds its age. It is read at most every ``refresh_delay()`` seconds,
and the last horizon is kept: what was settled then still is.
"""

from __future__ import annotations

from sqlqueue.horizon import UNKNOWN, SettledCache, WriteHorizon, settled_before
from sqlqueue.integrations.spark.connect import Connection


def read_write_horizon(db: Connection) -> WriteHorizon | None:
    """The open transactions as INNODB_TRX shows them from inside our own transaction
    (None: nothing commits out of offset order here; ``UNKNOWN``: not readable). ``db``
    is in autocommit mode, outside any transaction (beginning one would commit it)."""
    statement = db.sql.write_horizon()
    if statement is None:
        return None
    if _galera(db):
        return UNKNOWN  # a node's INNODB_TRX misses transactions open on other nodes
    try:
        with db.transaction(begin=db.sql.begin_snapshot_sql):
            row = db.one(statement)
    except Exception:  # no PROCESS privilege: nothing known
        return UNKNOWN
    return db.sql.parse_write_horizon(row)


def _galera(db: Connection) -> bool:
    """Is ``db`` a Galera node? Asked once per connection."""
    known: bool | None = getattr(db, "_sqlqueue_galera", None)
    if known is None:
        try:
            statement = db.sql.galera()
            row = db.one(statement) if statement is not None else None
            known = bool(row and row[0] and int(row[0]))
        except Exception:  # MySQL: no such variable
            known = False
        db._sqlqueue_galera = known  # type: ignore[attr-defined]
    return known


def settled_before_ms(db: Connection, now_ms: int, max_transaction_age_ms: int,
                      previous_ms: int | None = None) -> int | None:
    """Database time before which every inserted row is settled; None: all are.
    ``previous_ms``: an earlier result, still true."""
    seen = read_write_horizon(db)
    if seen is None:
        return None
    return settled_before(seen, now_ms, max_transaction_age_ms, previous_ms)


def database_now_ms(db: Connection) -> int:
    row = db.one(db.sql.database_now_ms())
    assert row is not None
    return int(row[0])


class Horizon:
    """``settled_before_ms``, read at most every ``refresh_delay()`` seconds (a
    ``SettledCache``, as the consumer engine keeps); the last value is kept, for reuse
    and as the earliest next one."""

    def __init__(self, max_transaction_age_ms: int) -> None:
        self.max_transaction_age_ms = max_transaction_age_ms
        self.cache = SettledCache()

    def __call__(self, db: Connection) -> int | None:
        return self.cache.get(lambda previous: settled_before_ms(
            db, database_now_ms(db), self.max_transaction_age_ms, previous))


def settled_end(db: Connection, start: int, max_rows: int | None, horizon: Horizon,
                scan_limit: int) -> int:
    """The exclusive end of the run of settled offsets from ``start``: every offset below
    it that will ever exist is visible now. Stops after ``max_rows`` rows of the log."""
    head_row = db.one(db.sql.head_offset())
    head = int(head_row[0]) if head_row and head_row[0] is not None else 0
    if head < start:
        return start
    before = horizon(db)
    if max_rows is None:
        if before is None:
            return head + 1
        created = db.one(db.sql.created_at_of(head))
        if created is not None and int(created[0]) < before:
            return head + 1  # the newest row is settled, hence every row below it
    end = start
    for offset, created_at in db.rows(db.sql.offsets_from(start, max_rows or scan_limit)):
        if before is not None and int(created_at) >= before:
            break  # a transaction that may still commit below this row is open
        end = int(offset) + 1
    return end
