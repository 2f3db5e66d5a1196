"""Before a command touches the queue: is this database usable at all?

``runconsumer`` and ``manage.py queue`` call ``ensure_ready()`` first, so that a database
nobody migrated, or a MySQL connection in the wrong character set, stops them with one
line that says what to do, instead of reconnecting forever or printing a traceback.
"""

from __future__ import annotations

from django.db import connections
from django.db.migrations.loader import MigrationLoader

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.exceptions import ConfigurationError, NotMigrated

APP_LABEL = "sqlqueue"


__all__ = ["ConfigurationError", "NotMigrated", "ensure_ready", "migration_state"]


def migration_state(alias: str) -> tuple[list[str], list[str]]:
    """(all of sqlqueue's migrations, those not applied on ``alias``), in dependency
    order; one read of ``django_migrations`` (none at all if it does not exist)."""
    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    ours = [name for app, name in loader.graph.forwards_plan(_leaf(loader))
            if app == APP_LABEL]
    applied = loader.applied_migrations or {}
    return ours, [name for name in ours if (APP_LABEL, name) not in applied]


def _leaf(loader: MigrationLoader) -> tuple[str, str]:
    (app, name) = loader.graph.leaf_nodes(APP_LABEL)[0]  # migrate refuses several heads
    return str(app), str(name)


def ensure_ready(alias: str | None = None) -> None:
    """Raise ``ConfigurationError`` (``NotMigrated`` for missing tables) naming the fix,
    before anything is read or written on the queue's database."""
    alias = alias or get_settings().DATABASE
    storage.store(alias).check_connection()
    ours, missing = migration_state(alias)
    if missing and missing == ours:
        raise NotMigrated.no_tables(alias)
    if missing:
        what = f"lacks sqlqueue migration(s) {', '.join(missing)}"
        raise NotMigrated(
            f"Database {alias!r} {what}: run `manage.py migrate` (add `--database {alias}` "
            "if it is not the default database)."
        )
