"""The database names the settings gave, remembered when Django starts.

Django's test setup (``django.test.utils.setup_databases``, which its test runner and
pytest-django both call) creates a test database for each alias and then writes its name
over ``NAME`` in the settings, in place: afterwards nothing says which database the
settings named. ``sqlqueue.testing`` needs to know (it refuses to run on a database the
test setup did not create), so the app remembers each alias's ``NAME`` when it becomes
ready, which is always before any test database is made.
"""

from __future__ import annotations

from typing import Any

_configured: dict[str, str] = {}


def remember_configured_names(databases: dict[str, dict[str, Any]]) -> None:
    """Called by the app's ``ready()`` with ``settings.DATABASES``. An alias remembered
    already keeps its first name: a later call (code that calls ``ready()`` again) may
    come after the test setup renamed the databases."""
    for alias, settings_dict in databases.items():
        _configured.setdefault(alias, str(settings_dict.get("NAME") or ""))


def configured_name(alias: str) -> str | None:
    """The ``NAME`` the settings gave ``alias`` when Django started (None: not known)."""
    return _configured.get(alias)
