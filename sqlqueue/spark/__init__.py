"""sqlqueue's Spark pipeline, at a short path (docs/guides/spark.md)::

    from sqlqueue.spark import local_session, options_from_settings
    spark = local_session()
    df = spark.read.format("sqlqueue").option("url", "mysql://...").load()

    DATABASE_URL=mysql://... python -m sqlqueue.spark.analytics --out report/

Needs ``pip install django-sqlqueue[spark]`` (PySpark 4.2+, pyarrow) and Java 17+.
"""

from __future__ import annotations

from sqlqueue.integrations.spark import (
    SQLQueueDataSource,
    database_url,
    local_session,
    options_from_settings,
    register,
)

__all__ = ["SQLQueueDataSource", "database_url", "local_session", "options_from_settings",
           "register"]
