"""One settings module for every peer; BENCH_PEER picks the peer-specific bits.

Everything machine-specific comes from environment variables with defaults
that work on the benchmark VM (MariaDB on 127.0.0.1:3306, Redis on 6379).
"""
import os

PEER = os.environ.get("BENCH_PEER", "none")

SECRET_KEY = "bench-peers-not-secret"
DEBUG = False  # DEBUG=True would log every query and enable db_worker autoreload
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# DB_ENGINE: "mysql" (MariaDB/MySQL, the default) or "postgresql" (psycopg 3, READ
# COMMITTED: the peers' and sqlqueue's defaults).
DB_ENGINE = os.environ.get("DB_ENGINE", "mysql")
DATABASES = {
    "default": {
        "ENGINE": f"django.db.backends.{DB_ENGINE}",
        "NAME": os.environ.get("DB_NAME", "bench_peers"),
        "USER": os.environ.get("DB_USER", "bench"),
        "PASSWORD": os.environ.get("DB_PASSWORD", "bench"),
        "HOST": os.environ.get("DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DB_PORT", "5432" if DB_ENGINE == "postgresql" else "3306"),
        "CONN_MAX_AGE": 0,
        "OPTIONS": {"charset": "utf8mb4"} if DB_ENGINE == "mysql" else {},
    }
}

# Redis: host/port from env; each use gets its own logical DB index so the
# benchmark never touches keys of anything else on the server.
REDIS_HOST = os.environ.get("REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("REDIS_PORT", "6379"))
REDIS_DB_RECORDER = int(os.environ.get("REDIS_DB_RECORDER", "11"))
REDIS_DB_CELERY = int(os.environ.get("REDIS_DB_CELERY", "12"))
REDIS_DB_DRAMATIQ = int(os.environ.get("REDIS_DB_DRAMATIQ", "13"))

# DB_URL (mysql://user:pass@host:port/name or postgres://...) overrides the DB_* variables:
# the sqlqueue adapter's scenarios also run on PostgreSQL.
if os.environ.get("DB_URL"):
    from urllib.parse import unquote, urlsplit

    _url = urlsplit(os.environ["DB_URL"])
    _postgres = _url.scheme in ("postgres", "postgresql")
    DATABASES["default"].update({
        "ENGINE": f"django.db.backends.{'postgresql' if _postgres else 'mysql'}",
        "NAME": _url.path.lstrip("/"), "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""), "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or (5432 if _postgres else 3306)),
        "OPTIONS": {} if _postgres else {"charset": "utf8mb4"},
    })

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "benchjobs.apps.BenchJobsConfig",
]

# BENCH_LOG_LEVEL=INFO: the workers' logs (.runs/logs/) say what each one did and when.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"timed": {"format": "%(asctime)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "timed"}},
    "root": {"handlers": ["console"], "level": os.environ.get("BENCH_LOG_LEVEL", "WARNING")},
}

# Worker knobs passed by the driver through the environment.
BENCH_WORKERS = int(os.environ.get("BENCH_WORKERS", "1"))
BENCH_POLL = os.environ.get("BENCH_POLL", "")  # "" = the peer's default

if PEER == "tasks_db":
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {
        "default": {
            "BACKEND": "django_tasks_db.DatabaseBackend",
            "QUEUES": ["default"],
        }
    }

elif PEER == "django_q2":
    INSTALLED_APPS.append("django_q")
    Q_CLUSTER = {
        "name": "benchpeers",
        "orm": "default",  # ORM broker on MariaDB
        "workers": BENCH_WORKERS,
        "log_level": "WARNING",
        # timeout/retry set only to silence django-q2's misconfiguration warning
        "timeout": 60,
        "retry": 120,
    }
    if BENCH_POLL:
        Q_CLUSTER["poll"] = float(BENCH_POLL)  # default 0.2 s
    if os.environ.get("BENCH_Q2_RECYCLE"):  # experiment knob; default 500
        Q_CLUSTER["recycle"] = int(os.environ["BENCH_Q2_RECYCLE"])

elif PEER == "celery":
    CELERY_BROKER_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB_CELERY}"
    CELERY_TASK_DEFAULT_QUEUE = "benchpeers"
    # no result backend configured (Celery's default): results are not stored

elif PEER == "procrastinate":
    # PostgreSQL only. Deferring goes through Django's connection (so it joins the
    # transaction.atomic() block); `manage.py procrastinate worker` opens its own psycopg
    # connector to the same database, with Procrastinate's defaults: LISTEN/NOTIFY on,
    # polling every 5 s as a fallback, one job at a time per worker process.
    INSTALLED_APPS.append("procrastinate.contrib.django")
    PROCRASTINATE_AUTODISCOVER_MODULE_NAME = ""  # benchjobs has no tasks.py
    PROCRASTINATE_IMPORT_PATHS = ["benchjobs.procrastinate_jobs"]

elif PEER in ("sqlqueue", "sqlqueue_batch"):
    # Only this branch imports sqlqueue; benchjobs.apps imports
    # benchjobs.sqlqueue_consumers (or, for sqlqueue_batch, sqlqueue_batch_consumers) in
    # ready(), which registers the no-op consumer.
    INSTALLED_APPS.append("sqlqueue")
    SQLQUEUE = {"POLL_INTERVAL": float(BENCH_POLL)} if BENCH_POLL else {}
    # Wake-ups (docs/guides/consuming.md): BENCH_WAKEUPS=0 turns them off (polling only);
    # BENCH_WAKEUP_REDIS_URL adds the Redis channel (MySQL/MariaDB).
    if os.environ.get("BENCH_WAKEUPS") == "0":
        SQLQUEUE["WAKEUPS"] = False
    if os.environ.get("BENCH_WAKEUP_REDIS_URL"):
        SQLQUEUE["WAKEUP_REDIS_URL"] = os.environ["BENCH_WAKEUP_REDIS_URL"]
    # BENCH_PREPARED_PUBLISH=0: PostgreSQL runs every publish's INSERT unprepared.
    if os.environ.get("BENCH_PREPARED_PUBLISH") == "0":
        SQLQUEUE["PREPARED_PUBLISH"] = False
