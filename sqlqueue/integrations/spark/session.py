"""A local SparkSession ready for the ``sqlqueue`` source, and the registration itself.

Two things trip every first run (research in docs/guides/spark.md): Spark's Python
workers start ``python3`` from PATH rather than the current interpreter (so they miss
the virtualenv's pyarrow), and Spark needs a Java 17+ runtime. ``prepare_environment``
points both at what this process uses, unless they are set already.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Java versions Spark 4 runs on, best first
JAVA_VERSIONS = ("17", "21")


def find_java_home() -> str | None:
    """JAVA_HOME, or a Java 17/21 under /usr/lib/jvm; None if ``java`` is on PATH anyway
    (or nothing is found)."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    for version in JAVA_VERSIONS:
        for home in sorted(glob.glob(f"/usr/lib/jvm/*{version}*")):
            if os.path.exists(os.path.join(home, "bin", "java")):
                return home
    return None


def prepare_environment() -> None:
    """Make Spark's Python workers use this interpreter, and find Java."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    home = find_java_home()
    if home and "JAVA_HOME" not in os.environ:
        os.environ["JAVA_HOME"] = home
    if not home and shutil.which("java") is None:
        raise RuntimeError("Spark needs a Java 17 or 21 runtime: install "
                           "openjdk-17-jre-headless, or set JAVA_HOME")


def register(spark: SparkSession) -> None:
    """Make ``format("sqlqueue")`` available in ``spark``."""
    from sqlqueue.integrations.spark.source import SQLQueueDataSource

    spark.dataSource.register(SQLQueueDataSource)


def local_session(app_name: str = "sqlqueue", cores: int = 2,
                  config: dict[str, Any] | None = None) -> SparkSession:
    """A ``local[cores]`` session with the source registered: UTC session time zone,
    no UI, few shuffle partitions (small data, few cores)."""
    prepare_environment()
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(f"local[{cores}]").appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", str(max(2, cores)))
               .config("spark.sql.execution.arrow.pyspark.enabled", "true"))
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
