"""The analytics job: ``python -m sqlqueue.spark.analytics`` or ``spark-submit`` this file.

    DATABASE_URL=mysql://user:pass@host/db python -m sqlqueue.spark.analytics --out report/
    spark-submit --master local[2] "$(python -c \
        'import sqlqueue.spark.analytics as m; print(m.__file__)')" --archive DIR --out report/

See sqlqueue.integrations.spark.analytics and docs/guides/spark.md.
"""

from __future__ import annotations

import sys

from sqlqueue.integrations.spark.analytics import Report, Window, main, run

__all__ = ["Report", "Window", "main", "run"]

if __name__ == "__main__":
    sys.exit(main())
