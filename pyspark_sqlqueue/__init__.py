"""``format("sqlqueue")`` with no registration: PySpark 4 looks, when a session starts,
for top-level modules named ``pyspark_*`` that define ``DefaultSource`` (a Python data
source), and registers each under its ``name()``. Installing django-sqlqueue with its
``spark`` extra puts this one on every Python that has the package, drivers and executors
alike. ``sqlqueue.spark.register(spark)`` remains for sessions started before the import
path had it."""

from sqlqueue.integrations.spark.source import SQLQueueDataSource as DefaultSource

__all__ = ["DefaultSource"]
