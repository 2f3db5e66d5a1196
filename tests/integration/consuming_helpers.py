"""Helpers for running consumers inside the test process."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.registry import consumer, select_consumers, unregister
from sqlqueue.consuming.runner import Runner

RUN_TIMEOUT = 60.0


def fast_settings(**overrides: Any) -> QueueSettings:
    """Short intervals so that tests wait milliseconds, not seconds."""
    values: dict[str, Any] = {"POLL_INTERVAL": 0.01, "MIN_BACKOFF": 0.02, "MAX_BACKOFF": 0.1,
                                  "SHUTDOWN_TIMEOUT": 10, "VISIBILITY_TIMEOUT": 30}
    values.update(overrides)
    return dataclasses.replace(QueueSettings(), **values)


def run_until(runner: Runner, condition: Callable[[], bool],
              timeout: float = RUN_TIMEOUT) -> list[float | None]:
    """Passes of ``runner`` (``run_once``) until ``condition`` holds; fail after ``timeout``
    seconds. Handler threads run on their own: this waits on them, never on a clock.
    Returns the delay each pass asked for."""
    import time

    delays: list[float | None] = []
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {len(delays)} passes"
        delays.append(runner.run_once())
        time.sleep(0.005)
    return delays


def drain(groups: list[str], topics: list[str] | None = None, **kwargs: Any) -> Runner:
    """Run the selected consumers with --until-empty semantics on a thread; fail the test
    if they do not finish."""
    conf = kwargs.pop("conf", None) or fast_settings()
    runner = Runner(select_consumers(groups, topics or []), until_empty=True, conf=conf,
                    **kwargs)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(install_signal_handlers=False)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(RUN_TIMEOUT)
    if thread.is_alive():
        runner.stop()
        thread.join(10)
        pytest.fail(f"the consumers did not finish within {RUN_TIMEOUT}s")
    if errors:
        raise errors[0]
    return runner


@pytest.fixture
def register() -> Iterator[Callable[..., Callable[..., Any]]]:
    """Register handlers for one test: register(topic, group, handler, **options)."""
    added: list[tuple[str, str]] = []

    def add(topic: str, group: str, handler: Callable[..., Any], **options: Any) -> Any:
        consumer(topic, group=group, **options)(handler)
        added.append((group, topic))
        return handler

    yield add
    for group, topic in added:
        unregister(group, topic)


def watermarks(group: str) -> dict[str, int]:
    from sqlqueue.models import PartitionOffset

    return dict(PartitionOffset.objects.filter(consumer_group=group)
                .values_list("partition_key", "offset_acked"))


def reached(group: str, expected: dict[str, int]) -> bool:
    current = watermarks(group)
    return set(current) == set(expected) and all(current[k] >= v for k, v in expected.items())


def drain_until_watermarks(
    group: str, expected: dict[str, int], timeout: float = 20, **kwargs: Any
) -> None:
    """Drain until the group's watermarks reach at least ``expected``. On MySQL a watermark
    trails the newest rows by the write horizon (one to two seconds): this waits on that."""
    import time

    deadline = time.monotonic() + timeout
    while not reached(group, expected):
        if time.monotonic() > deadline:
            raise AssertionError(f"watermarks {watermarks(group)} never reached {expected}")
        time.sleep(0.2)
        drain([group], **kwargs)


def queue(*args: str) -> str:
    """``manage.py queue ARGS``'s standard output."""
    out = StringIO()
    call_command("queue", *args, stdout=out)
    return out.getvalue()
