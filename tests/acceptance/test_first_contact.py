"""What a new user meets first (issue 13, SPEC §9 "First contact"), in real processes:
bad settings are check ids, never start-up tracebacks."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.acceptance.first_contact import manage, script, write_settings
from tests.acceptance.processes import database_url

# Django's Tasks framework: django.tasks (Django 6), else the django-tasks backport
# (Django 5.2, the LTS stack of make test-lts).
TASKS = "django.tasks" if find_spec("django.tasks") is not None else "django_tasks"
needs_tasks = pytest.mark.skipif(not getattr(settings, "HAS_TASKS", False),
                                 reason="needs Django's Tasks framework")


@needs_tasks
@pytest.mark.parametrize("command", [("check",), ("help",), ("runconsumer", "--until-empty")])
def test_bad_sqlqueue_setting_with_tasks_is_a_check_error_not_a_traceback(
    tmp_path: Path, command: tuple[str, ...],
) -> None:
    module = write_settings(tmp_path, 'SQLQUEUE = {"POLL_INTERVAL": "fast"}\n')
    result = manage(tmp_path, module, *command)
    assert "Traceback" not in result.stderr, result.stderr
    if command[0] == "help":
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 1
    assert "(sqlqueue.E003) SQLQUEUE['POLL_INTERVAL'] must be a number of seconds" in (
        result.stderr)


@needs_tasks
@pytest.mark.parametrize(("options", "expected"), [
    ('{"MAX_ATTEMPTS": "3"}', "'MAX_ATTEMPTS' must be an integer; got '3'"),
    ('{"QUEUE": "x"}', "unknown key 'QUEUE'"),
    ('{"ORDERED": "yes"}', "'ORDERED' must be True or False; got 'yes'"),
])
def test_bad_tasks_options_are_check_e202(tmp_path: Path, options: str, expected: str) -> None:
    module = write_settings(tmp_path, f'TASKS["default"]["OPTIONS"] = {options}\n')
    result = manage(tmp_path, module, "check")
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1
    assert "(sqlqueue.E202) TASKS['default']['OPTIONS']" in result.stderr
    assert expected in result.stderr
    # The other, valid backend still runs; the broken one refuses work with the same text.
    code = (f"from {TASKS} import task_backends\n"
            "from sqlqueue.exceptions import ConfigurationError\n"
            "from tests.testapp import tasks\n"
            "try:\n    tasks.add.enqueue(1, 2)\n"
            "except ConfigurationError as exc:\n    print('refused:', exc)\n")
    result = script(tmp_path, module, code)
    assert result.returncode == 0, result.stderr
    assert "refused: TASKS['default']['OPTIONS']" in result.stdout and expected in result.stdout


@needs_tasks
def test_empty_queues_and_clashing_backends_are_check_e202(tmp_path: Path) -> None:
    module = write_settings(tmp_path, (
        'TASKS["default"]["QUEUES"] = []\n'
        'TASKS["twin"] = {"BACKEND": "sqlqueue.tasks.SQLQueueBackend",\n'
        '                 "OPTIONS": {"TOPIC_PREFIX": "strict.", "GROUP": "strict-tasks"}}\n'
    ))
    result = manage(tmp_path, module, "check")
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1
    assert "(sqlqueue.E202) TASKS['default']['QUEUES'] is empty" in result.stderr
    assert "(sqlqueue.E202) TASKS['twin']: queue 'default' maps to topic 'strict.default'" in (
        result.stderr)


@needs_tasks
def test_e201_fires_when_sqlqueue_is_not_installed(tmp_path: Path) -> None:
    module = write_settings(tmp_path, (
        'INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in ("sqlqueue", "tests.testapp")]\n'
    ))
    # Django registers its Tasks checks once django.tasks is imported (by any tasks module).
    result = script(tmp_path, module, (
        f"import {TASKS}\nfrom django.core.management import call_command\n"
        "call_command('check')\n"))
    assert "RuntimeError" not in result.stderr, result.stderr
    assert "(sqlqueue.E201) TASKS['default'] uses sqlqueue.tasks.SQLQueueBackend" in (
        result.stderr)


ADMIN_PAGES = """
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from sqlqueue import send_message
send_message("shop.orders", {"n": 1}, partition_key="k")
client = Client()
client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
for page in ("admin:sqlqueue_queuemessage_changelist", "admin:sqlqueue_deadletter_changelist"):
    response = client.get(reverse(page))
    print(page, response.status_code, "date-range" if "__range__gte" in response.text else "")
"""


@pytest.mark.database_independent  # a SQLite file of its own (Makefile)
def test_admin_without_rangefilter_warns_and_its_pages_work(tmp_path: Path) -> None:
    module = write_settings(tmp_path, (
        'INSTALLED_APPS = [a for a in INSTALLED_APPS if a != "rangefilter"]\n'
        "DEBUG_PROPAGATE_EXCEPTIONS = True\n"
    ))
    database = f"sqlite:///{tmp_path / 'shop.sqlite3'}"  # the same on every database
    result = manage(tmp_path, module, "check", database=database)
    assert result.returncode == 0, result.stderr
    assert "(sqlqueue.W003) 'rangefilter' is not in INSTALLED_APPS" in result.stderr
    assert manage(tmp_path, module, "migrate", "-v", "0", database=database).returncode == 0
    result = script(tmp_path, module, ADMIN_PAGES, database=database)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [
        "admin:sqlqueue_queuemessage_changelist 200 ",
        "admin:sqlqueue_deadletter_changelist 200 ",
    ]
    # With the app installed: no warning, and the date-range filters are there.
    result = manage(tmp_path, write_settings(tmp_path, "", "full"), "check", database=database)
    assert result.returncode == 0 and "W003" not in result.stderr
    result = script(tmp_path, "full", ADMIN_PAGES.replace('"boss"', '"boss2"'),
                    database=database)
    assert result.stdout.split("\n")[:2] == [
        "admin:sqlqueue_queuemessage_changelist 200 date-range",
        "admin:sqlqueue_deadletter_changelist 200 date-range",
    ], result.stderr


# -- a database nobody migrated ------------------------------------------------------------

@pytest.fixture
def unmigrated_database(tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database of the vendor under test."""
    if connection.vendor == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite3'}"
        return
    name = f"{connection.settings_dict['NAME']}_nomigrate"
    quoted = connection.ops.quote_name(name)
    charset = " ENCODING 'UTF8'" if connection.vendor == "postgresql" else " CHARACTER SET utf8mb4"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")
        cursor.execute(f"CREATE DATABASE {quoted}{charset}")
    try:
        yield database_url().rsplit("/", 1)[0] + f"/{name}"
    finally:
        with connection.cursor() as cursor:
            # PostgreSQL refuses to drop a database a session is still connected to.
            force = " WITH (FORCE)" if connection.vendor == "postgresql" else ""
            cursor.execute(f"DROP DATABASE IF EXISTS {quoted}{force}")


MIGRATE = "has no sqlqueue tables: run `manage.py migrate`"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("command", [
    ("runconsumer", "--until-empty"),
    ("runconsumer",),
    ("queue", "status"),
    ("queue", "dead-letters", "list"),
    ("queue", "gc"),
])
def test_unmigrated_database_is_one_line_and_exit_1(
    tmp_path: Path, unmigrated_database: str, command: tuple[str, ...],
) -> None:
    module = write_settings(tmp_path, "")
    result = manage(tmp_path, module, *command, database=unmigrated_database, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == f"CommandError: Database 'default' {MIGRATE} (add `--database default` " \
                   "if it is not the default database)."


@pytest.mark.django_db(transaction=True)
def test_partly_migrated_database_names_the_missing_migrations(
    tmp_path: Path, unmigrated_database: str,
) -> None:
    module = write_settings(tmp_path, "")
    result = manage(tmp_path, module, "migrate", "sqlqueue", "0004", "-v", "0",
                    database=unmigrated_database)
    assert result.returncode == 0, result.stderr
    result = manage(tmp_path, module, "queue", "status", database=unmigrated_database)
    assert result.returncode == 1
    # (later migrations, if any, follow in the list)
    assert "lacks sqlqueue migration(s) 0005_task_results, 0006_created_at_default" in (
        result.stderr)
    assert "run `manage.py migrate`" in result.stderr


# -- a MySQL connection that is not utf8mb4 ------------------------------------------------

LATIN1 = 'DATABASES["default"].setdefault("OPTIONS", {})["charset"] = "latin1"\n'
CHARSET_REFUSAL = ("The connection to database 'default' uses the character set 'latin1'; "
                   "sqlqueue needs utf8mb4")


@pytest.mark.django_db(transaction=True)
def test_latin1_connection_is_refused_before_any_write(tmp_path: Path) -> None:
    if connection.vendor != "mysql":
        pytest.skip("character sets of the connection are MySQL/MariaDB's")
    from sqlqueue.models import QueueMessage

    module = write_settings(tmp_path, LATIN1)
    result = script(tmp_path, module, (
        "from sqlqueue import send_message, send_messages\n"
        "from sqlqueue.exceptions import ConfigurationError\n"
        "for publish in (lambda: send_message('latin.test', {'n': 1}, partition_key='kéy🦆'),\n"
        "                lambda: send_messages('latin.test', [{'n': 2}])):\n"
        "    try:\n        publish()\n"
        "    except ConfigurationError as exc:\n        print('refused:', exc)\n"
    ))
    assert result.returncode == 0, result.stderr
    refusals = result.stdout.strip().splitlines()
    assert len(refusals) == 2 and all(CHARSET_REFUSAL in line for line in refusals)
    assert "Set DATABASES['default']['OPTIONS']['charset'] = 'utf8mb4'" in refusals[0]
    assert not QueueMessage.objects.filter(topic="latin.test").exists()
    for command in (("runconsumer", "--until-empty"), ("queue", "status")):
        result = manage(tmp_path, module, *command, timeout=60)
        assert result.returncode == 1, result.stderr
        assert CHARSET_REFUSAL in result.stderr and "Traceback" not in result.stderr


def test_runconsumer_with_nothing_registered_says_where_consumers_are_looked_for(
        tmp_path: Path) -> None:
    """SPEC §10: not "--group and --topic", which the user never gave."""
    # Neither the test app's consumers nor the Tasks backends' (Django 6).
    module = write_settings(tmp_path, "INSTALLED_APPS = [a for a in INSTALLED_APPS "
                                      "if a != 'tests.testapp']\nTASKS = {}\n")
    result = manage(tmp_path, module, "runconsumer", "--until-empty")
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    assert "--group" not in result.stderr and "--topic" not in result.stderr
    assert "No consumer is registered" in result.stderr
    assert "<app>/consumers.py" in result.stderr
    assert "sqlqueue" in result.stderr.split("looked for in:")[1]  # the apps it searched


@pytest.mark.database_independent  # a SQLite file of its own (Makefile)
@pytest.mark.parametrize("publish", [
    "from sqlqueue import send_message\nsend_message('orders.created', {'n': 1})\n",
    "from sqlqueue import send_messages\nsend_messages('orders.created', [1, 2])\n",
    "from django.db import transaction\nfrom sqlqueue import send_message\n"
    "with transaction.atomic():\n    send_message('orders.created', {'n': 1})\n",
])
def test_publishing_before_migrate_names_migrate(tmp_path: Path, publish: str) -> None:
    """Issue 37: not the driver's "no such table: queue_messages"."""
    module = write_settings(tmp_path, "")
    code = ("from sqlqueue.exceptions import NotMigrated\n"
            f"try:\n    exec({publish!r})\n"
            "except NotMigrated as exc:\n    print('refused:', exc)\n")
    result = script(tmp_path, module, code, database=f"sqlite:///{tmp_path / 'new.sqlite3'}")
    assert result.returncode == 0, result.stderr
    assert ("refused: Database 'default' has no sqlqueue tables: run `manage.py migrate`"
            in result.stdout)


@pytest.mark.database_independent  # a SQLite file of its own (Makefile)
@needs_tasks
def test_enqueue_before_migrate_names_migrate(tmp_path: Path) -> None:
    module = write_settings(tmp_path, "")
    code = ("from sqlqueue.exceptions import NotMigrated\nfrom tests.testapp import tasks\n"
            "try:\n    tasks.add.enqueue(1, 2)\n"
            "except NotMigrated as exc:\n    print('refused:', exc)\n")
    result = script(tmp_path, module, code, database=f"sqlite:///{tmp_path / 'new.sqlite3'}")
    assert result.returncode == 0, result.stderr
    assert "refused: Database 'default' has no sqlqueue tables" in result.stdout
