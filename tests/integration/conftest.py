from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def exits_without_waiting_for_the_horizon(request: pytest.FixtureRequest,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runners exit without waiting for MySQL's write horizon to pass the rows
    they acked last (``Runner.exit_settle_seconds``): the horizon moves in whole seconds,
    and a test publishes its messages a moment before its runner exits, so each exit
    waited half a second or more for it, 290 of the MariaDB integration tier's 486
    seconds. The exit still makes its one pass (the fence, the horizon, the watermark
    moves); what it leaves above the watermarks is the partitions' next holder's, as
    after an exit while a publisher is open. Tests of the exit's positions (marker
    ``exit_settles``) and every ``runconsumer`` process of the acceptance tier wait as
    users' runners do."""
    if request.node.get_closest_marker("exit_settles") is None:
        from sqlqueue.consuming.runner import Runner

        monkeypatch.setattr(Runner, "exit_settle_seconds", 0.0)  # undone after the test
