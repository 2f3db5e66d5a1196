"""Django settings for the benchmarks: DATABASE_URL (default: MariaDB, sqlqueue_bench)."""

from __future__ import annotations

import json
import os

import environ

_url = os.environ.get("BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench")
_database = environ.Env.db_url_config(_url)
if _database["ENGINE"].endswith("mysql"):
    _database["OPTIONS"] = {"charset": "utf8mb4"}
else:
    _database["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20,
                            "init_command": "PRAGMA journal_mode=WAL;"}
DATABASES = {"default": _database}
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "sqlqueue", "bench"]
USE_TZ = True
SECRET_KEY = "bench-not-secret"
SQLQUEUE = {"BATCH_SIZE": int(os.environ.get("BENCH_BATCH", "100")),
            **json.loads(os.environ.get("BENCH_SQLQUEUE_JSON", "{}"))}
