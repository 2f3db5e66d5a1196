"""Settings for the test suite.

The database comes from ``DATABASE_URL`` (django-environ syntax):

    DATABASE_URL=sqlite:////tmp/sqlqueue-tests.sqlite3  (the default)
    DATABASE_URL=mysql://root@127.0.0.1:3306/test       (MariaDB / MySQL)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test (PostgreSQL, psycopg 3)

Django creates and destroys a ``test_...`` database next to the named one.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib.util import find_spec
from pathlib import Path

import environ

env = environ.Env()
BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "sqlqueue-tests-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"

_default_sqlite = f"sqlite:///{Path(tempfile.gettempdir()) / 'sqlqueue-tests.sqlite3'}"
_database = env.db_url("DATABASE_URL", default=_default_sqlite)
if _database["ENGINE"] == "django.db.backends.mysql":
    _database.setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
elif _database["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not the in-memory default, so that a second connection in another thread
    # or process really is a second connection with its own locks.
    _database["TEST"] = {
        "NAME": str(Path(tempfile.gettempdir()) / f"test-sqlqueue-{os.getpid()}.sqlite3")
    }
    # IMMEDIATE: a transaction takes the write lock at BEGIN, so two publishers queue up
    # instead of failing with "database is locked" when one upgrades a read lock.
    _database.setdefault("OPTIONS", {}).update({"timeout": 20, "transaction_mode": "IMMEDIATE"})
elif _database["ENGINE"] == "django.db.backends.postgresql" and env.bool(
        "SQLQUEUE_TEST_SERVER_SIDE_BINDING", default=False):
    # Django's server-side parameter binding with psycopg's prepared statements, which
    # Django turns off unless OPTIONS sets "prepare_threshold": every statement must state
    # the types the server cannot infer, and every one is prepared on its first run (0),
    # so a statement that breaks once prepared fails here rather than on its sixth run.
    _database.setdefault("OPTIONS", {}).update(
        {"server_side_binding": True, "prepare_threshold": 0})
# "routes": the same database under a second alias (a test mirror), to check that
# SQLQUEUE["ROUTES"] and runconsumer --database pick the alias they name.
DATABASES = {"default": _database,
             "routes": {**_database, "TEST": {**_database.get("TEST", {}), "MIRROR": "default"}}}
# "listen": a second address of the same database for the wake-up listener
# (SQLQUEUE["WAKEUP_LISTEN_DATABASES"]), as behind PgBouncer in transaction mode.
if os.environ.get("SQLQUEUE_TEST_LISTEN_URL"):
    DATABASES["listen"] = env.db_url("SQLQUEUE_TEST_LISTEN_URL")

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django.contrib.staticfiles",  # the admin's CSS, served by the browser tests' live server
    "rangefilter",
    "sqlqueue",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Subprocesses started by the acceptance tests get their timing through the environment.
SQLQUEUE: dict[str, object] = json.loads(os.environ.get("SQLQUEUE_JSON", "{}"))

# Django's Tasks framework (Django 6.0+, or the django-tasks backport on 5.2): two
# sqlqueue backends, the second atomic and strictly ordered (tests/testapp/tasks.py).
HAS_TASKS = any(find_spec(name) is not None for name in ("django.tasks", "django_tasks"))
if HAS_TASKS:
    _fast_retries = {"MAX_ATTEMPTS": 3, "MIN_BACKOFF": 0.02, "MAX_BACKOFF": 0.1}
    TASKS = {
        "default": {
            "BACKEND": "sqlqueue.tasks.SQLQueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": _fast_retries,
        },
        "strict": {
            "BACKEND": "sqlqueue.tasks.SQLQueueBackend",
            "OPTIONS": {**_fast_retries, "TOPIC_PREFIX": "strict.", "GROUP": "strict-tasks",
                        "ORDERED": True, "ATOMIC": True},
        },
    }
    if find_spec("django.tasks") is None:
        # The backport is an app: its system checks (which run the backends' own, such
        # as sqlqueue.E201) are registered when it is installed (docs/guides/tasks.md).
        INSTALLED_APPS.append("django_tasks")

if os.environ.get("SQLQUEUE_TEST_LOG"):
    LOGGING = {
        "version": 1,
        "handlers": {"console": {"class": "logging.StreamHandler"}},
        "formatters": {},
        "loggers": {"sqlqueue": {"handlers": ["console"], "level": "INFO"}},
    }

if os.environ.get("SQLQUEUE_TEST_LEASE_EVENTS"):
    # An acceptance run's worker (tests/acceptance/histories.py): its lease events, one
    # JSON line each, for the run's history (tests/history).
    LOGGING = {
        "version": 1, "disable_existing_loggers": False,
        "handlers": {"leases": {"()": "tests.history.lease_log.LeaseLines",
                                "path": os.environ["SQLQUEUE_TEST_LEASE_EVENTS"],
                                "runner": os.environ.get("SQLQUEUE_TEST_RUNNER")}},
        "loggers": {"sqlqueue.leases": {"handlers": ["leases"], "level": "DEBUG"}},
    }
