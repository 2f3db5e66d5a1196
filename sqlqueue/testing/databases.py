"""The toolkit runs on test databases only (``allow_any_database=True`` aside).

``run_consumers`` outside a test transaction commits as it goes, takes real partition
leases and runs handlers; after ``advance_clock`` it delivers scheduled messages early.
Called by mistake from ``manage.py shell`` or a script, that is production traffic. So
both refuse a database that Django's test setup did not create.

The signal is the database's name. Django's test setup (its test runner and
pytest-django both go through ``django.test.utils.setup_databases``) creates each test
database under its test name and writes that name over the alias's ``NAME``:

- ``TEST["NAME"]`` when the settings give one (pytest-django's xdist workers give one,
  with their suffix), else ``"test_"`` followed by the configured ``NAME``;
- on SQLite without ``TEST["NAME"]``, an in-memory database;
- in a parallel test run, a clone named after it: ``<test name>_<n>`` (SQLite files:
  ``<root>_<n><ext>``; in memory under spawn);
- an alias whose ``TEST["MIRROR"]`` names another one takes that one's name.

A database passes if its ``NAME`` now is one of those and differs from the ``NAME`` the
settings gave (remembered when the app became ready): outside a test run the two are the
same. Nothing else needs to be set up: ``setup_test_environment()`` alone (which Django's
tutorial calls in a shell on the real database) is not a test database.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any, cast

from django.db import connections
from django.db.backends.base.creation import TEST_DATABASE_PREFIX

from sqlqueue.database_names import configured_name
from sqlqueue.exceptions import SqlqueueError


class NotATestDatabase(SqlqueueError):
    """A testing-toolkit call found a database Django's test setup did not create."""


#: why each entry point refuses, for its error
RISKS = {
    "run_consumers()": "outside a test's transaction it commits as it goes, takes real "
                       "partition leases and runs the handlers on real messages",
    "advance_clock()": "every later run_consumers() would deliver retries and scheduled "
                       "messages early",
}


def refuse_unless_test_databases(caller: str, aliases: Iterable[str]) -> None:
    """Raise ``NotATestDatabase`` naming the first of ``aliases`` that is not a test
    database, before anything is read or written."""
    for alias in aliases:
        problem = _not_a_test_database(alias, seen=set())
        if problem:
            raise NotATestDatabase(
                f"{caller} refuses to run on the database {problem}: {RISKS[caller]}. "
                "Call it in a test (django.test.TestCase, or pytest-django's db fixture), "
                f"or pass allow_any_database=True to {caller} to run it on this database "
                "anyway (docs/guides/testing.md of django-sqlqueue).")


def _not_a_test_database(alias: str, seen: set[str]) -> str | None:
    """None if ``alias`` is a test database; else what to say about it."""
    connection = connections[alias]
    settings_dict = connection.settings_dict
    name = str(settings_dict.get("NAME") or "")
    test = settings_dict.get("TEST") or {}
    mirror = test.get("MIRROR")
    seen.add(alias)
    if mirror and mirror not in seen and mirror in connections.settings and (
            name == str(connections[mirror].settings_dict.get("NAME") or "")):
        return _not_a_test_database(mirror, seen)
    sqlite = connection.vendor == "sqlite"
    if sqlite and cast(Any, connection.creation).is_in_memory_db(name):
        return None  # a test database, or one that vanishes with the process
    configured = configured_name(alias)
    # (A NAME may be a Path: compared as text.)
    test_name = str(test.get("NAME") or "") or (
        None if sqlite or configured is None else TEST_DATABASE_PREFIX + configured)
    if name != configured and test_name and _named_after(name, test_name, sqlite):
        return None
    expected = f"; its test database would be {test_name!r}" if test_name else ""
    return (f"{name!r} (alias {alias!r}), which Django's test setup did not create"
            f"{expected}")


def _named_after(name: str, test_name: str, sqlite: bool) -> bool:
    """``name`` is ``test_name`` or a parallel test run's clone of it."""
    if name == test_name:
        return True
    if sqlite:
        root, ext = os.path.splitext(test_name)
        return re.fullmatch(re.escape(root) + r"_\d+" + re.escape(ext), name) is not None
    return re.fullmatch(re.escape(test_name) + r"_\d+", name) is not None
