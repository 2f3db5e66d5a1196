"""The Tasks backend's pure parts: OPTIONS, the priority mapping, the message envelope."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from sqlqueue.exceptions import ConfigurationError
from sqlqueue.integrations.tasks.envelope import BadEnvelope, open_envelope, seal
from sqlqueue.integrations.tasks.models import MAX_TRACEBACK_CHARS, truncated
from sqlqueue.integrations.tasks.options import (
    DEFAULT_RESULT_RETENTION,
    TaskOptions,
    message_priority,
    parse_options,
)


def test_default_options() -> None:
    options = parse_options("default", None)
    assert options == TaskOptions()
    assert options.topic("emails") == "tasks.emails"
    assert options.group == "tasks" and options.max_attempts is None
    assert options.result_retention == DEFAULT_RESULT_RETENTION == 7 * 86400


def test_options_override_consumer_settings() -> None:
    options = parse_options("default", {
        "GROUP": "jobs", "TOPIC_PREFIX": "", "ORDERED": True, "ATOMIC": True,
        "MAX_ATTEMPTS": 8, "VISIBILITY_TIMEOUT": timedelta(minutes=5),
        "RESULT_RETENTION": timedelta(days=1),
    })
    assert options.topic("default") == "default" and options.group == "jobs"
    assert options.ordered and options.atomic
    assert dict(options.consumer_overrides) == {"max_attempts": 8, "visibility_timeout": 300.0}
    assert options.max_attempts == 8 and options.result_retention == 86400


@pytest.mark.parametrize(("raw", "message"), [
    ({"MAX_ATTEMPT": 3}, "unknown key 'MAX_ATTEMPT'"),
    ({"MAX_ATTEMPTS": 0}, "'MAX_ATTEMPTS' must be >= 1; got 0"),
    ({"ATOMIC": "yes"}, "'ATOMIC' must be True or False"),
    ({"RESULT_RETENTION": 0}, "'RESULT_RETENTION' must be > 0"),
    ({"GROUP": ""}, "GROUP must not be empty"),
    ({"TOPIC_PREFIX": "bad\nprefix"}, "control character"),
    ([1, 2], "must be a dict"),
])
def test_bad_options_are_named(raw: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match="TASKS\\['default'\\]\\['OPTIONS'\\]") as err:
        parse_options("default", raw)
    assert message in str(err.value)


def test_priority_mapping_is_strictly_monotonic_and_in_range() -> None:
    mapped = [message_priority(p) for p in range(-100, 101)]
    assert mapped[0] == 200 and mapped[-1] == 0 and message_priority(0) == 100
    assert all(a > b for a, b in itertools.pairwise(mapped))  # higher runs first


def test_envelope_round_trip_and_strict_json() -> None:
    envelope = seal("shop.tasks.send", (1, "a"), {"copy": True})
    assert envelope.payload() == {"task": "shop.tasks.send", "args": [1, "a"],
                                  "kwargs": {"copy": True}}
    assert open_envelope(envelope.payload()) == envelope
    with pytest.raises(TypeError, match="must be JSON"):
        seal("shop.tasks.send", (object(),), {})
    with pytest.raises(TypeError, match="must be JSON"):
        seal("shop.tasks.send", (float("nan"),), {})
    with pytest.raises(ValueError, match="longer than 255 bytes"):
        seal("x" * 300, (), {})


@pytest.mark.parametrize("payload", [[1], {"args": []}, {"task": "t", "args": {}}, "text"])
def test_a_payload_that_is_no_task_is_refused(payload: object) -> None:
    with pytest.raises(BadEnvelope):
        open_envelope(payload)


def test_long_tracebacks_keep_their_start_and_end() -> None:
    text = "start" + "x" * (2 * MAX_TRACEBACK_CHARS) + "end"
    kept = truncated(text)
    assert len(kept) < MAX_TRACEBACK_CHARS + 100
    assert kept.startswith("start") and kept.endswith("end") and "truncated" in kept


def test_two_threads_finding_the_registry_empty_both_find_the_task(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two handler threads miss the same task at once: the second waits for the first
    one's imports, and finds the task (it failed with TaskNotFound while the imports
    ran: CI, tests/acceptance/test_tasks_worker.py)."""
    import threading

    from sqlqueue.integrations.tasks import results

    importing, release = threading.Event(), threading.Event()

    def slow_autodiscover(name: str) -> None:
        importing.set()
        assert release.wait(10)
        results._TASKS["shop.tasks.later"] = "the task"  # type: ignore[assignment]

    monkeypatch.setattr(results, "_TASKS", {})
    monkeypatch.setattr(results, "_discovered", False)
    monkeypatch.setattr(results, "autodiscover_modules", slow_autodiscover)
    found: list[object] = []
    first = threading.Thread(target=lambda: found.append(results.load_task("shop.tasks.later")))
    first.start()
    assert importing.wait(10)
    second = threading.Thread(target=lambda: found.append(results.load_task("shop.tasks.later")))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the first one's imports, not failing
    release.set()
    first.join(10)
    second.join(10)
    assert found == ["the task", "the task"]
