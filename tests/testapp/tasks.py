"""Tasks for the tests of the Django Tasks backend (tests/*/test_tasks*.py).

Effects are ``Order`` rows, so that a test (or another process) can read back what ran
and in which order (primary keys follow creation).
"""

from __future__ import annotations

from typing import Any

import sqlqueue
from sqlqueue.integrations.tasks.compat import TaskContext, task
from tests.testapp.models import Order


@task
def add(a: int, b: int) -> int:
    return a + b


@task
async def add_later(a: int, b: int) -> int:
    return a + b


@task
def create_order(reference: str) -> int:
    return Order.objects.create(reference=reference).pk


@task(queue_name="emails")
def send_email(to: str) -> str:
    Order.objects.create(reference=f"mail:{to}")
    return f"sent to {to}"


@task
def always_fails(reason: str) -> None:
    raise ValueError(reason)


@task(takes_context=True)
def flaky(context: TaskContext[Any, Any], failures: int) -> int:
    """Fails its first ``failures`` attempts; returns the attempt that worked."""
    if context.attempt <= failures:
        raise ConnectionError(f"attempt {context.attempt} timed out")
    return context.attempt


@task
def needs_order(reference: str) -> str:
    """Fails until the order exists (a dead letter to replay once it does)."""
    if not Order.objects.filter(reference=reference).exists():
        raise LookupError(f"no order {reference}")
    return reference


@task(takes_context=True)
def asks_to_wait(context: TaskContext[Any, Any]) -> int:
    """Asks for a retry on its first attempt (not an error), then succeeds."""
    if context.attempt == 1:
        raise sqlqueue.Retry(delay=0, reason="the upstream is busy")
    return context.attempt


@task
def rejects() -> None:
    raise sqlqueue.Reject("no point trying again")


@task
def returns_text_with_a_nul() -> str:
    return "a\x00b"  # PostgreSQL's jsonb cannot hold it (issue 36)


@task
def returns_a_set() -> Any:
    return {1, 2}  # not JSON


@task(backend="strict")
def create_order_atomically(reference: str, fail: bool = False) -> int:
    """On the ATOMIC backend: a failure rolls the order back with the attempt."""
    pk = Order.objects.create(reference=reference).pk
    if fail:
        raise RuntimeError(f"failing after creating {reference}")
    return pk
