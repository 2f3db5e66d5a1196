"""Django settings for the benchmarks: DATABASE_URL (default: MariaDB, sqlqueue_bench)."""

from __future__ import annotations

import json
import os

import environ

_url = os.environ.get("BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench")
_database = environ.Env.db_url_config(_url)
if _database["ENGINE"].endswith("mysql"):
    _database["OPTIONS"] = {"charset": "utf8mb4"}
elif _database["ENGINE"].endswith("postgresql"):
    _database["OPTIONS"] = {}  # READ COMMITTED, psycopg 3: the defaults sqlqueue expects
else:
    _database["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20,
                            "init_command": "PRAGMA journal_mode=WAL;"}
DATABASES = {"default": _database}
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "sqlqueue", "bench"]
USE_TZ = True
SECRET_KEY = "bench-not-secret"
SQLQUEUE = {"BATCH_SIZE": int(os.environ.get("BENCH_BATCH", "100")),
            **json.loads(os.environ.get("BENCH_SQLQUEUE_JSON", "{}"))}
if os.environ.get("BENCH_SOAK_DIR"):
    # bench.soak's subscribers: each process appends its lease events (the sqlqueue.lease
    # log event) to a file of its own there, for the soak's history (tests/history).
    LOGGING = {
        "version": 1, "disable_existing_loggers": False,
        "handlers": {"leases": {
            "()": "tests.history.lease_log.LeaseLines",
            "path": os.path.join(os.environ["BENCH_SOAK_DIR"], f"leases-{os.getpid()}.jsonl")}},
        "loggers": {"sqlqueue.leases": {"handlers": ["leases"], "level": "DEBUG"}},
    }

# The admin, for the dashboard benchmark (bench.lag_page).
INSTALLED_APPS += ["django.contrib.sessions", "django.contrib.messages",
                   "django.contrib.admin", "rangefilter"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "bench.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
