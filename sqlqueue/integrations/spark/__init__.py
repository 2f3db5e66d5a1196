"""The Spark pipeline (``pip install django-sqlqueue[spark]``; docs/guides/spark.md).

Layout: ``source`` (the ``sqlqueue`` Python Data Source) with ``reader`` (batch reads),
``writer`` and ``rows`` (publishing rows), ``stream``, ``horizon`` and ``group``
(streaming, as a consumer group too); ``connect``, ``options``, ``tables`` and ``arrow``
(the database side; its statements are the shared layer's, sqlqueue.storage.statements).
None of these import Django: Spark's executors run them. Driver side only: ``session`` (a
local session), ``settings`` (options from a Django project), ``archive`` with
``archive_batches`` and ``archive_layout`` (Parquet export before garbage collection,
``manage.py queue archive``) and ``analytics`` with ``analytics_inputs`` and
``analytics_aggregates`` (the report job).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlqueue.integrations.spark.session import local_session, register
    from sqlqueue.integrations.spark.settings import database_url, options_from_settings
    from sqlqueue.integrations.spark.source import SQLQueueDataSource

__all__ = ["SQLQueueDataSource", "database_url", "local_session", "options_from_settings",
           "register"]

_EXPORTS = {
    "SQLQueueDataSource": "sqlqueue.integrations.spark.source",
    "database_url": "sqlqueue.integrations.spark.settings",
    "local_session": "sqlqueue.integrations.spark.session",
    "options_from_settings": "sqlqueue.integrations.spark.settings",
    "register": "sqlqueue.integrations.spark.session",
}


def __getattr__(name: str) -> Any:
    # Lazy, so that importing one module of the package (as Spark's workers do) loads
    # neither pyspark's session machinery nor Django.
    from importlib import import_module

    if name not in _EXPORTS:
        raise AttributeError(name)
    return getattr(import_module(_EXPORTS[name]), name)
