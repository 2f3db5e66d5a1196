"""The options of ``format("sqlqueue")``, checked while Spark plans the query.

Spark hands the options over with lower-cased keys (a ``CaseInsensitiveDict``), so they
are looked up by lower-cased name here; ``numPartitions`` and ``numpartitions`` are the
same option. Every value arrives as a string. An unknown option is an error, so that a
misspelt one does not silently fall back to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlqueue.integrations.spark.connect import Database, Tls
from sqlqueue.integrations.spark.errors import InvalidOption
from sqlqueue.integrations.spark.tables import Table, table_named
from sqlqueue.naming import MAX_NAME_BYTES, check_name

#: option name -> (default, what it is); the defaults of sqlqueue's settings are those
#: of the SQLQUEUE setting (sqlqueue.spark.options_from_settings() copies yours).
OPTIONS: dict[str, tuple[str | None, str]] = {
    "url": (None, "the database, as DATABASE_URL: mysql://user:pass@host:3306/db, "
                  "postgres://user:pass@host:5432/db or sqlite:////path/db.sqlite3"),
    "user": (None, "overrides the url's user"),
    "password": (None, "overrides the url's password (Spark redacts this option)"),
    "table": ("messages", "messages, dead_letters, delivery_state, offsets, leases, "
                          "heartbeats"),
    "topic": (None, "only this topic (dead_letters: the topic they came from)"),
    "fromOffset": (None, "batch read: the first offset (inclusive)"),
    "untilOffset": (None, "batch read: the end offset (exclusive)"),
    "numPartitions": (None, "Spark partitions of a read (default: one per "
                            "offsetsPerPartition offsets)"),
    "offsetsPerPartition": ("100000", "offsets per Spark partition of a read"),
    "fetchSize": ("10000", "rows per Arrow batch"),
    "startingOffsets": ("earliest", "stream: earliest, latest, or an offset"),
    "maxRowsPerTrigger": ("100000", "stream: most log rows per micro-batch"),
    "maxTransactionAge": ("300", "stream: SQLQUEUE['MAX_TRANSACTION_AGE'], seconds"),
    "consumerGroup": (None, "stream: commit micro-batches as this consumer group"),
    "subscriberName": (None, "stream: the group's subscriber name (default spark:GROUP)"),
    "leaseDuration": ("30", "stream: SQLQUEUE['LEASE_DURATION'], seconds"),
    "leaseRenewInterval": ("10", "stream: SQLQUEUE['LEASE_RENEW_INTERVAL'], seconds"),
    "bulkLoad": ("off", "write: off (INSERT) or on (LOAD DATA LOCAL on MySQL/MariaDB, "
                        "from memory on a connection of its own; 'auto' is the old "
                        "name of on)"),
    "sslMode": ("preferred", "TLS: disabled, preferred, required, verify-ca or "
                             "verify-identity (as mysql --ssl-mode; on PostgreSQL libpq's "
                             "disable, prefer, require, verify-ca, verify-full)"),
    "sslCa": (None, "TLS: the certificate authority file to verify the server"),
    "sslCert": (None, "TLS: the client certificate file"),
    "sslKey": (None, "TLS: the client key file"),
    "batchSize": ("10000", "write: rows per transaction (PostgreSQL: one COPY each)"),
    "defaultPartitions": ("16", "write: SQLQUEUE['DEFAULT_PARTITIONS']"),
    "maxPayloadBytes": ("1048576", "write: SQLQUEUE['MAX_PAYLOAD_BYTES']"),
    "dlqSuffix": ("_dlq", "write: SQLQUEUE['DLQ_SUFFIX'] (topics leave room for it)"),
}
_BY_LOWER = {name.lower(): name for name in OPTIONS}
#: Spark adds this one itself when load()/save() is given a path.
_IGNORED = {"path"}


def _lowered(options: Mapping[str, Any]) -> dict[str, str]:
    values: dict[str, str] = {}
    for key, value in options.items():
        lower = str(key).lower()
        if lower in _IGNORED:
            continue
        if lower not in _BY_LOWER:
            raise InvalidOption(f"unknown option {key!r}; the options are "
                                f"{', '.join(OPTIONS)}")
        values[lower] = str(value)
    return values


def _integer(name: str, value: str | None, *, minimum: int, maximum: int | None = None,
             ) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise InvalidOption(f"option {name!r} must be a whole number; got {value!r}") from None
    if number < minimum:
        raise InvalidOption(f"option {name!r} must be >= {minimum}; got {number}")
    if maximum is not None and number > maximum:
        raise InvalidOption(f"option {name!r} must be <= {maximum}; got {number}")
    return number


def _seconds(name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise InvalidOption(f"option {name!r} is a number of seconds; got {value!r}") from None
    if not 0 < number < float("inf"):
        raise InvalidOption(f"option {name!r} must be > 0 seconds; got {value!r}")
    return number


def _name_option(name: str, value: str | None, max_bytes: int = MAX_NAME_BYTES) -> str | None:
    if value is None:
        return None
    try:
        return check_name(f"option {name!r}", value, max_bytes)
    except ValueError as exc:
        raise InvalidOption(str(exc)) from None


@dataclass(frozen=True)
class SourceOptions:
    """Every option, checked and typed; picklable (it travels to the executors)."""

    database: Database
    table: Table
    topic: str | None
    from_offset: int | None
    until_offset: int | None
    num_partitions: int | None
    offsets_per_partition: int
    fetch_size: int
    starting_offsets: str  # "earliest", "latest" or digits
    max_rows_per_trigger: int
    max_transaction_age_ms: int
    consumer_group: str | None
    subscriber_name: str | None
    lease_duration_ms: int
    lease_renew_interval: float
    bulk_load: bool
    batch_size: int
    default_partitions: int
    max_payload_bytes: int
    dlq_suffix: str

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SourceOptions:
        raw = _lowered(options)

        def get(name: str) -> str | None:
            return raw.get(name.lower(), OPTIONS[name][0])

        def number(name: str, minimum: int, maximum: int | None = None) -> int | None:
            return _integer(name, get(name), minimum=minimum, maximum=maximum)

        tls = Tls(mode=(get("sslMode") or "").strip().lower(), ca=get("sslCa") or "",
                  cert=get("sslCert") or "", key=get("sslKey") or "")
        database = Database.from_url(get("url") or "", user=get("user"),
                                     password=get("password"), tls=tls)
        dlq_suffix = get("dlqSuffix") or ""
        if not dlq_suffix or len(dlq_suffix.encode("utf-8")) > 64:
            raise InvalidOption("option 'dlqSuffix' must be 1 to 64 bytes long")
        topic_bytes = MAX_NAME_BYTES - len(dlq_suffix.encode("utf-8"))
        starting = (get("startingOffsets") or "").strip().lower()
        # isdigit() alone takes '²' or '٣', which int() then refuses (or reads as 3)
        if starting not in ("earliest", "latest") and not (starting.isascii()
                                                          and starting.isdigit()):
            raise InvalidOption("option 'startingOffsets' is earliest, latest or an offset; "
                                f"got {get('startingOffsets')!r}")
        bulk = (get("bulkLoad") or "").strip().lower()
        if bulk not in ("on", "auto", "off"):
            raise InvalidOption(f"option 'bulkLoad' is on or off; got {get('bulkLoad')!r}")
        lease = _seconds("leaseDuration", get("leaseDuration") or "")
        renew = _seconds("leaseRenewInterval", get("leaseRenewInterval") or "")
        if renew >= lease:
            raise InvalidOption("option 'leaseRenewInterval' must be shorter than "
                                "'leaseDuration', or the leases expire between renewals")
        from_offset, until_offset = number("fromOffset", 0), number("untilOffset", 0)
        if from_offset is not None and until_offset is not None and until_offset < from_offset:
            raise InvalidOption("option 'untilOffset' is below 'fromOffset'")
        return cls(
            database=database,
            table=table_named(get("table") or ""),
            topic=_name_option("topic", get("topic"), topic_bytes),
            from_offset=from_offset,
            until_offset=until_offset,
            num_partitions=number("numPartitions", 1, 10_000),
            offsets_per_partition=number("offsetsPerPartition", 1) or 1,
            fetch_size=number("fetchSize", 1, 1_000_000) or 1,
            starting_offsets=starting,
            max_rows_per_trigger=number("maxRowsPerTrigger", 1) or 1,
            max_transaction_age_ms=round(1000 * _seconds(
                "maxTransactionAge", get("maxTransactionAge") or "")),
            consumer_group=_name_option("consumerGroup", get("consumerGroup")),
            subscriber_name=_name_option("subscriberName", get("subscriberName")),
            lease_duration_ms=round(1000 * lease),
            lease_renew_interval=renew,
            bulk_load=bulk != "off",
            batch_size=number("batchSize", 1, 1_000_000) or 1,
            default_partitions=number("defaultPartitions", 1, 100_000) or 1,
            max_payload_bytes=number("maxPayloadBytes", 1, 1 << 30) or 1,
            dlq_suffix=dlq_suffix,
        )

    def require_topic(self, purpose: str) -> str:
        if self.topic is None:
            raise InvalidOption(f"option 'topic' is required to {purpose}")
        return self.topic
