"""The analytics job on a known data set, from the live database and from the archive."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from sqlqueue.integrations.spark.analytics import AGGREGATES, Window, main, run
from sqlqueue.integrations.spark.archive import archive
from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage

T0 = int(datetime(2026, 1, 1, 10, 0, tzinfo=UTC).timestamp() * 1000)
MINUTE = 60_000
HOUR = 60 * MINUTE


def message(topic: str, partition: str, mid: str, created_at: int, **extra: Any) -> int:
    row = QueueMessage.objects.create(topic=topic, partition_key=partition, id=mid,
                                      payload=b"{}", created_at=created_at,
                                      published_at=created_at, **extra)
    return int(row.offset)


def state(group: str, offset: int, created_at: int, latency: int, retries: int = 0,
          partition: str = "k0") -> None:
    DeliveryState.objects.create(consumer_group=group, topic="orders", partition_key=partition,
                                 message_offset=offset, acked=True, retry_count=retries,
                                 acked_at=created_at + latency)


def dead_letter(group: str, original: int, partition: str, error: str) -> None:
    message("orders_dlq", partition, f"{original}@{group}", T0 + 2 * HOUR,
            consumer_group=group, original_topic="orders", failure_count=5,
            last_error=f"Traceback (most recent call last):\n  ...\n{error}\n",
            failure_detail={"offset": original, "group": group})


def known_data_set() -> list[int]:
    """orders: m0..m9, ten minutes apart from 10:00 (m0..m5 in hour 10, m6..m9 in hour
    11), k0 for even n, k1 for odd. billing finished all (latency (n+1)*100 ms, m3 and m7
    on a second attempt) and dead-lettered m9; emails finished m0..m4 (1 s each); audit
    dead-lettered m0..m2 (no delivery history). emails.out: two messages in hour 10."""
    offsets = []
    for n in range(10):
        created = T0 + n * 10 * MINUTE
        partition = f"k{n % 2}"
        offset = message("orders", partition, f"m{n}", created)
        offsets.append(offset)
        if n < 9:
            state("billing", offset, created, (n + 1) * 100, retries=1 if n in (3, 7) else 0,
                  partition=partition)
        else:
            state("billing", offset, created, 5000, retries=4, partition=partition)
        if n < 5:
            state("emails", offset, created, 1000, partition=partition)
    dead_letter("billing", offsets[9], "k1", "ValueError: card declined")
    for n, error in enumerate(["KeyError: 'sku'", "KeyError: 'sku'", "TimeoutError: slow"]):
        dead_letter("audit", offsets[n], f"k{n % 2}", error)
    message("emails.out", "x", "e0", T0 + 5 * MINUTE)
    message("emails.out", "x", "e1", T0 + 15 * MINUTE)
    for group in ("billing", "emails"):
        for partition in ("k0", "k1"):
            PartitionOffset.objects.create(consumer_group=group, topic="orders",
                                           partition_key=partition, offset_acked=offsets[-1],
                                           updated_at=T0)
    return offsets


def hour(h: int) -> pd.Timestamp:
    return pd.Timestamp(datetime(2026, 1, 1, h, tzinfo=UTC))


def check_known_aggregates(frames: dict[str, pd.DataFrame]) -> None:
    per_hour = {(r.topic, r.partition_key, r.hour): r.messages
                for r in frames["messages_per_hour"].itertuples()}
    assert per_hour == {
        ("emails.out", "x", hour(10)): 2,
        ("orders", "k0", hour(10)): 3, ("orders", "k1", hour(10)): 3,
        ("orders", "k0", hour(11)): 2, ("orders", "k1", hour(11)): 2,
    }
    latency = frames["latency"].set_index(["consumer_group", "topic"])
    billing = latency.loc[("billing", "orders")]
    assert (billing.acked, billing.p50_ms, billing.p90_ms, billing.p99_ms, billing.max_ms) == (
        9, 500, 900, 900, 900)  # m9 was dead-lettered: not in the latency
    assert (billing.mean_attempts, billing.max_attempts, billing.retried) == (1.222, 2, 2)
    emails = latency.loc[("emails", "orders")]
    assert (emails.acked, emails.p50_ms, emails.max_attempts) == (5, 1000, 1)
    assert set(latency.index) == {("billing", "orders"), ("emails", "orders")}

    attempts = {(r.consumer_group, r.attempts): r.messages
                for r in frames["attempts"].itertuples()}
    assert attempts == {("billing", 1): 7, ("billing", 2): 2, ("emails", 1): 5}

    dead = {(r.consumer_group, r.topic): (r.dead_letters, r.messages, r.rate)
            for r in frames["dead_letters"].itertuples()}
    assert dead == {("audit", "orders"): (3, 10, 0.3), ("billing", "orders"): (1, 10, 0.1)}
    errors = [(r.consumer_group, r.rank, r.error, r.dead_letters)
              for r in frames["top_errors"].itertuples()]
    assert errors == [("audit", 1, "KeyError: 'sku'", 2), ("audit", 2, "TimeoutError: slow", 1),
                      ("billing", 1, "ValueError: card declined", 1)]

    lag = {(r.consumer_group, r.hour): (r.published, r.acked, r.lag)
           for r in frames["lag"].itertuples()}
    assert lag == {
        ("billing", hour(10)): (6, 6, 0), ("billing", hour(11)): (10, 10, 0),
        ("emails", hour(10)): (6, 5, 1), ("emails", hour(11)): (10, 5, 5),
    }


def test_the_report_on_the_live_database(spark: Any, db_url: str, tmp_path: Path) -> None:
    known_data_set()
    report = run(spark, tmp_path / "report", url=db_url)
    check_known_aggregates(report.frames)
    out = tmp_path / "report"
    for name in AGGREGATES:
        csv = pd.read_csv(out / "aggregates" / f"{name}.csv")
        parquet = pd.read_parquet(out / "aggregates" / f"{name}.parquet")
        assert len(csv) == len(parquet) == len(report.frames[name])
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 5
    assert "KeyError: &#x27;sku&#x27;" in page  # escaped
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "attempts.png", "dead_letters.png", "lag.png", "latency.png", "messages_per_hour.png"]
    assert spark.conf.get("spark.sql.session.timeZone") == "America/New_York"  # restored


def test_the_report_on_the_archive_equals_the_live_one(spark: Any, db_url: str,
                                                       tmp_path: Path) -> None:
    known_data_set()
    live = run(spark, tmp_path / "live", url=db_url)
    archive(tmp_path / "archive")
    archived = run(spark, tmp_path / "from-archive", archive=tmp_path / "archive")
    # emails.out has no consumer group: it is never archived (nor garbage-collected).
    assert not archived.frames["messages_per_hour"]["topic"].eq("emails.out").any()
    for name in AGGREGATES:
        expected = live.frames[name]
        if name in ("messages_per_hour",):
            expected = expected[expected["topic"] != "emails.out"].reset_index(drop=True)
        pd.testing.assert_frame_equal(archived.frames[name], expected, check_dtype=False)


def test_a_window_and_a_topic(spark: Any, db_url: str, tmp_path: Path) -> None:
    known_data_set()
    report = run(spark, tmp_path, url=db_url, topics=["orders"],
                 window=Window(since=datetime(2026, 1, 1, 11, tzinfo=UTC)))
    per_hour = report.frames["messages_per_hour"]
    assert set(per_hour["hour"]) == {hour(11)} and set(per_hour["topic"]) == {"orders"}
    assert int(per_hour["messages"].sum()) == 4
    by_minute = run(spark, tmp_path, url=db_url, bucket="minute").frames
    assert len(by_minute["messages_per_minute"]) == 12  # ten minutes apart: one each
    assert (tmp_path / "aggregates" / "messages_per_minute.csv").exists()
    assert list(by_minute["lag"].columns[:3]) == ["consumer_group", "topic", "minute"]


def test_without_delivery_history_the_report_says_so(spark: Any, db_url: str,
                                                     tmp_path: Path) -> None:
    message("orders", "k0", "only", T0)
    report = run(spark, tmp_path, url=db_url)
    assert report.frames["latency"].empty and report.frames["lag"].empty
    assert "KEEP_DELIVERY_STATE" in (tmp_path / "report.html").read_text()


def test_the_command_line(spark: Any, db_url: str, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    known_data_set()
    assert main(["--url", db_url, "--out", str(tmp_path), "--since", "2026-01-01"]) == 0
    printed = capsys.readouterr().out
    assert "Report on 12 message(s)" in printed and str(tmp_path / "report.html") in printed
    summary = json.loads(pd.read_csv(tmp_path / "aggregates" / "latency.csv")
                         .to_json(orient="records"))
    assert {row["consumer_group"] for row in summary} == {"billing", "emails"}
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--since", "yesterday-ish", "--url", db_url])


@pytest.mark.parametrize("argv", [["--url", "mysql://u:Sup3rSecretPW@127.0.0.1/db"],
                                  ["--url", "mysql://u:Sup3rSecretPW@127.0.0.1/db",
                                   "--since", "7d"],
                                  # an unencoded / in the password (the audit's F8 residual)
                                  ["--url", "mysql://u:Sup3rSecret/PW@127.0.0.1/db"],
                                  ["--url", "postgres://127.0.0.1/db?password=Sup3rSecret"]])
def test_a_password_on_the_command_line_is_refused(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """F8 of the security audit: argv is public (ps); the url comes from the environment
    or a file."""
    from sqlqueue.integrations.spark.analytics import parse_arguments

    with pytest.raises(SystemExit) as exited:
        parse_arguments([*argv, "--out", str(tmp_path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "DATABASE_URL" in err and "--url-file" in err and "Sup3rSecret" not in err


def test_the_url_comes_from_a_file_or_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlqueue.integrations.spark.analytics import parse_arguments

    secret = tmp_path / "db-url"
    secret.write_text("mysql://u:Sup3rSecretPW@127.0.0.1/db\n")
    parsed = parse_arguments(["--url-file", str(secret), "--out", str(tmp_path)])
    assert parsed.url == "mysql://u:Sup3rSecretPW@127.0.0.1/db"
    monkeypatch.setenv("DATABASE_URL", "mysql://u:FromEnv@127.0.0.1/db")
    assert parse_arguments(["--out", str(tmp_path)]).url == "mysql://u:FromEnv@127.0.0.1/db"
