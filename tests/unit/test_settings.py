from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sqlqueue.conf import DEFAULTS, QueueSettings, validate

ALIASES = {"default": {}}


def ids(raw: Any) -> list[str]:
    return [p.id for p in validate(raw, ALIASES)[1]]


def test_defaults_are_the_specs() -> None:
    conf, problems = validate(None, ALIASES)
    assert problems == []
    assert conf == QueueSettings()
    assert DEFAULTS["POLL_INTERVAL"] == 0.1 and DEFAULTS["MAX_PAYLOAD_BYTES"] == 1048576
    assert conf.max_topic_bytes == 255 - len("_dlq")


def test_not_a_dict() -> None:
    conf, problems = validate(["BATCH_SIZE", 3], ALIASES)
    assert conf is None
    assert [p.id for p in problems] == ["sqlqueue.E001"]


def test_unknown_key_is_named() -> None:
    conf, problems = validate({"BATCH_SIZ": 3}, ALIASES)
    assert conf is None
    assert problems[0].id == "sqlqueue.E002" and "BATCH_SIZ" in problems[0].msg


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("POLL_INTERVAL", "0.1"),
        ("BATCH_SIZE", 2.5),
        ("BATCH_SIZE", True),
        ("MAX_ATTEMPTS", None),
        ("DATABASE", 1),
        ("DLQ_SUFFIX", b"_dlq"),
        ("RETENTION", [1]),
        ("IDEMPOTENCY_WINDOW", "1 day"),
    ],
)
def test_wrong_types(key: str, value: Any) -> None:
    assert ids({key: value}) == ["sqlqueue.E003"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("POLL_INTERVAL", 0),
        ("VISIBILITY_TIMEOUT", -1),
        ("BATCH_SIZE", 0),
        ("BATCH_SIZE", 10_001),
        ("MAX_ATTEMPTS", 0),
        ("THREADS", 0),
        ("DEFAULT_PARTITIONS", 0),
        ("MAX_PAYLOAD_BYTES", 0),
        ("SHUTDOWN_TIMEOUT", -0.5),
        ("RETENTION", float("inf")),
        ("IDEMPOTENCY_WINDOW", -1),
        ("MAX_TRANSACTION_AGE", 0),
        ("DLQ_SUFFIX", ""),
        ("DLQ_SUFFIX", "_d\nlq"),
        ("DLQ_SUFFIX", "x" * 65),
        ("DATABASE", ""),
    ],
)
def test_out_of_range(key: str, value: Any) -> None:
    problems = validate({key: value}, ALIASES)[1]
    assert [p.id for p in problems] == ["sqlqueue.E004"]
    assert key in problems[0].msg


def test_lease_renewal_must_be_shorter_than_the_lease() -> None:
    assert ids({"LEASE_DURATION": 10, "LEASE_RENEW_INTERVAL": 10}) == ["sqlqueue.E005"]
    assert ids({"LEASE_DURATION": 10, "LEASE_RENEW_INTERVAL": 6}) == ["sqlqueue.W001"]
    assert ids({"LEASE_DURATION": 30, "LEASE_RENEW_INTERVAL": 10}) == []


def test_backoff_bounds_must_be_ordered() -> None:
    assert ids({"MIN_BACKOFF": 10, "MAX_BACKOFF": 5}) == ["sqlqueue.E006"]


def test_database_alias_must_exist() -> None:
    assert ids({"DATABASE": "queue"}) == ["sqlqueue.E007"]


def test_poll_interval_longer_than_visibility_warns() -> None:
    conf, problems = validate({"POLL_INTERVAL": 90}, ALIASES)
    assert [p.id for p in problems] == ["sqlqueue.W002"]
    assert conf is not None  # a warning does not make the settings unusable


def test_timedeltas_are_seconds() -> None:
    conf, problems = validate({"RETENTION": timedelta(days=1)}, ALIASES)
    assert problems == [] and conf is not None
    assert conf.RETENTION == 86400.0
    assert validate({"IDEMPOTENCY_WINDOW": timedelta(hours=1)}, ALIASES)[0].IDEMPOTENCY_WINDOW \
        == 3600.0  # type: ignore[union-attr]


def test_every_error_is_reported_at_once() -> None:
    assert sorted(ids({"BATCH_SIZE": 0, "THREADS": "4", "NOPE": 1})) == [
        "sqlqueue.E002", "sqlqueue.E003", "sqlqueue.E004",
    ]
