"""sqlqueue's pytest plugin (entry point ``pytest11``: loaded wherever django-sqlqueue is
installed). It does nothing unless pytest-django is in use; then it offers:

* ``sqlqueue_run``: ``run_consumers`` for the test's database (``db``, or the transactional
  database when the test asks for one)::

      def test_order_is_paid(sqlqueue_run):
          place_order(...)
          assert sqlqueue_run(group="billing").acked == 1

* ``sqlqueue_captured``: every message the test publishes, a ``capture_messages()`` list
  around the whole test.

After every test, the queue's clock moved by ``advance_clock`` is set back.

Nothing here imports Django or sqlqueue's models at load time: a project without Django
settings (or without pytest-django) runs its tests as if the plugin were absent.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sqlqueue.testing.capture import CapturedMessages
    from sqlqueue.testing.runs import RunReport

#: the name pytest-django registers its plugin under
PYTEST_DJANGO = "django"


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin(PYTEST_DJANGO):
        config.pluginmanager.register(SqlqueueFixtures(), "sqlqueue-fixtures")


class SqlqueueFixtures:
    """The fixtures, registered only alongside pytest-django."""

    @pytest.fixture
    def sqlqueue_run(self, db: None) -> Callable[..., RunReport]:
        """``sqlqueue.testing.run_consumers``, in the test's database transaction."""
        from sqlqueue.testing import run_consumers

        return run_consumers

    @pytest.fixture
    def sqlqueue_captured(self, db: None) -> Iterator[CapturedMessages]:
        """The messages the test publishes (after this fixture is set up), oldest first."""
        from sqlqueue.testing import capture_messages

        with capture_messages() as captured:
            yield captured

    @pytest.fixture(autouse=True)
    def _sqlqueue_clock_back(self) -> Iterator[None]:
        """``advance_clock`` moves stay within their test (imported only if used)."""
        yield
        clock: Any = sys.modules.get("sqlqueue.testing.clock")
        if clock is not None:
            clock.reset_clock()
