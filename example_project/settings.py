"""Settings for the sqlqueue example project.

Everything that differs between a laptop and a server comes from the environment
(django-environ syntax), with defaults that are fine for local development only:

    DATABASE_URL=sqlite:////abs/path/db.sqlite3        (default: example_project/db.sqlite3)
    DATABASE_URL=mysql://user:pass@127.0.0.1:3306/shop  (MySQL 8.0+ / MariaDB 10.11+)
    SECRET_KEY=...   DEBUG=false   ALLOWED_HOSTS=shop.example.com,www.shop.example.com
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import environ

PROJECT_DIR = Path(__file__).resolve().parent
BASE_DIR = PROJECT_DIR.parent

env = environ.Env()

# The default key is public: fine on a laptop, never in production.
SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-sqlqueue-example-dev-only")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rangefilter",
    "sqlqueue",
    "example_project.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# -- database ------------------------------------------------------------------------
# The shop's tables and the queue's tables live in the same database, so one
# transaction covers an order and the message announcing it.

SQLITE_ENGINES = {
    "django.db.backends.sqlite3",
    "django.contrib.gis.db.backends.spatialite",
}
MYSQL_ENGINES = {
    "django.db.backends.mysql",
    "django.contrib.gis.db.backends.mysql",
}

_database = env.db_url("DATABASE_URL", default=f"sqlite:///{PROJECT_DIR / 'db.sqlite3'}")
if _database["ENGINE"] in SQLITE_ENGINES:
    _database.setdefault("OPTIONS", {}).update({
        # Take the write lock when the transaction starts rather than on its first
        # write, so two writers queue up on `timeout` instead of failing with
        # "database is locked" halfway through.
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        # WAL lets readers (consumers, the admin) run while a writer commits.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    })
elif _database["ENGINE"] in MYSQL_ENGINES:
    # Topics, keys and payloads are arbitrary Unicode; sqlqueue's checks require utf8mb4.
    _database.setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
DATABASES = {"default": _database}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# -- sqlqueue --------------------------------------------------------------------------
# Every key is optional. For example:
#     "VISIBILITY_TIMEOUT": 120,  # seconds a consumer may hold a message before redelivery
#     "MAX_ATTEMPTS": 10,         # deliveries before a message goes to the dead-letter topic
SQLQUEUE: dict[str, object] = {
    # Keep messages for a week after every consumer group is done with them, rather than
    # deleting them at once (the default): handled order events stay visible in the admin
    # and in `manage.py demo`, which is what you want when something needs explaining.
    "RETENTION": timedelta(days=7),
    # Keep each group's delivery state (ack time, attempts) until its message is deleted,
    # for the Spark analytics report's latency, attempts and lag (make spark-demo).
    "KEEP_DELIVERY_STATE": True,
    # Periodic work without a beat process: every runconsumer publishes the due ticks,
    # each exactly once (docs/guides/schedules.md). `manage.py queue schedules` lists them.
    "SCHEDULES": {
        "daily-sales-report": {
            "task": "example_project.shop.tasks.sales_report",
            "cron": "0 7 * * *",
            "timezone": "Europe/Paris",
        },
    },
}

# -- Django's Tasks framework ----------------------------------------------------------
# sqlqueue is the task backend: @task functions (shop/tasks.py) are enqueued in the
# caller's transaction and run by `manage.py runconsumer` (consumer group "tasks",
# topic "tasks.default"). docs/guides/tasks.md has every option.
TASKS = {
    "default": {
        "BACKEND": "sqlqueue.tasks.SQLQueueBackend",
        "OPTIONS": {"MAX_ATTEMPTS": 5, "RESULT_RETENTION": timedelta(days=7)},
    },
}
