"""sqlqueue.storage.retry: the one loop that tries a deadlock victim again."""

from __future__ import annotations

import pytest

from sqlqueue.storage import retry


class Victim(Exception):
    pass


def failing(times: int, error: Exception) -> tuple[list[int], object]:
    calls: list[int] = []

    def attempt() -> str:
        calls.append(len(calls) + 1)
        if len(calls) <= times:
            raise error
        return "done"

    return calls, attempt


@pytest.fixture
def pauses() -> list[float]:
    """What the loop slept (passed as its ``sleep``: no process-wide patch)."""
    return []


def test_a_victim_is_tried_again_after_each_pause(pauses: list[float]) -> None:
    calls, attempt = failing(2, Victim("deadlock"))
    retried: list[int] = []
    assert retry.retry_victims(attempt, tries=5,  # type: ignore[arg-type]
                               is_victim=lambda e: isinstance(e, Victim),
                               pause=lambda n: n / 10,
                               on_retry=lambda e, n: retried.append(n),
                               sleep=pauses.append) == "done"
    assert (calls, retried, pauses) == ([1, 2, 3], [1, 2], [0.1, 0.2])


def test_the_last_try_and_other_errors_are_raised(pauses: list[float]) -> None:
    calls, attempt = failing(9, Victim("deadlock"))
    with pytest.raises(Victim):
        retry.retry_victims(attempt, tries=3, is_victim=lambda e: True,  # type: ignore[arg-type]
                            pause=lambda n: 0, sleep=pauses.append)
    assert calls == [1, 2, 3]
    calls, attempt = failing(1, KeyError("other"))
    with pytest.raises(KeyError):
        retry.retry_victims(attempt, tries=3,  # type: ignore[arg-type]
                            is_victim=lambda e: isinstance(e, Victim), pause=lambda n: 0,
                            sleep=pauses.append)
    assert calls == [1] and len(pauses) == 2

