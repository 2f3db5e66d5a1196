"""The consumer loop survives every kind of database error, InterfaceError included (what
mysqlclient raises on a connection the server dropped; Django does not derive it from
DatabaseError)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import InterfaceError, OperationalError

from sqlqueue import send_message
from sqlqueue.consuming.runner import Runner
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


@pytest.mark.parametrize("error", [InterfaceError("(0, '')"),
                                   OperationalError(2006, "server has gone away")])
def test_the_loop_reconnects_after_a_database_error(register: Any, monkeypatch: Any,
                                                    error: Exception) -> None:
    handled: list[int] = []
    register("t", "g", lambda message: handled.append(message.offset))
    sent = send_message("t", 1, partition_key="k")
    cycle, raised = Runner._cycle, []

    def failing_once(self: Runner) -> float | None:
        if not raised:
            raised.append(error)
            raise error
        return cycle(self)

    monkeypatch.setattr(Runner, "_cycle", failing_once)
    drain(["g"])
    assert raised == [error] and handled == [sent.offset]
