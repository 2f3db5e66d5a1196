"""The testing toolkit runs on test databases only (issue 53, audit W6): which names
Django's test setup gives its databases, and which the toolkit therefore accepts. Read
from settings alone: connections are made, never opened."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db.utils import ConnectionHandler

from sqlqueue import database_names
from sqlqueue.testing import NotATestDatabase, databases

POSTGRES = "django.db.backends.postgresql"
MYSQL = "django.db.backends.mysql"
SQLITE = "django.db.backends.sqlite3"


@pytest.fixture
def configure(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``configure(configured, now)``: ``configured`` is the DATABASES the settings gave
    (remembered at start), ``now`` the settings dicts after the test setup (if any) renamed
    them."""
    def set_up(configured: dict[str, dict[str, Any]],
               now: dict[str, dict[str, Any]] | None = None) -> None:
        monkeypatch.setattr(database_names, "_configured", {})
        database_names.remember_configured_names(configured)
        monkeypatch.setattr(databases, "connections", ConnectionHandler(now or configured))

    yield set_up


def refused(alias: str = "default") -> str | None:
    try:
        databases.refuse_unless_test_databases("run_consumers()", [alias])
    except NotATestDatabase as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("engine", [POSTGRES, MYSQL])
def test_the_configured_database_is_refused_with_its_name(configure: Any, engine: str) -> None:
    configure({"default": {"ENGINE": engine, "NAME": "shop"}})
    error = refused()
    assert error is not None
    assert ("run_consumers() refuses to run on the database 'shop' (alias 'default'), which "
            "Django's test setup did not create; its test database would be 'test_shop'"
            in error)
    assert "allow_any_database=True" in error


@pytest.mark.parametrize("engine", [POSTGRES, MYSQL])
@pytest.mark.parametrize("test_name", ["test_shop", "test_shop_1", "test_shop_12"])
def test_the_test_database_and_its_parallel_clones_pass(configure: Any, engine: str,
                                                        test_name: str) -> None:
    configure({"default": {"ENGINE": engine, "NAME": "shop"}},
              {"default": {"ENGINE": engine, "NAME": test_name}})
    assert refused() is None


@pytest.mark.parametrize("name", ["test_shopx", "test_shop_", "test_shop_1a", "shop_test",
                                  "other"])
def test_a_name_that_merely_looks_like_it_is_refused(configure: Any, name: str) -> None:
    configure({"default": {"ENGINE": POSTGRES, "NAME": "shop"}},
              {"default": {"ENGINE": POSTGRES, "NAME": name}})
    assert refused() is not None


def test_a_production_database_named_test_something_is_refused(configure: Any) -> None:
    # Its test database would be test_test_shop: the name alone is not enough.
    configure({"default": {"ENGINE": POSTGRES, "NAME": "test_shop"}})
    assert "its test database would be 'test_test_shop'" in (refused() or "")


def test_the_test_name_of_the_settings_is_followed(configure: Any) -> None:
    test = {"NAME": "ci_shop"}  # pytest-django's xdist workers set one too (ci_shop_gw0)
    configure({"default": {"ENGINE": MYSQL, "NAME": "shop", "TEST": test}},
              {"default": {"ENGINE": MYSQL, "NAME": "ci_shop", "TEST": test}})
    assert refused() is None
    configure({"default": {"ENGINE": MYSQL, "NAME": "shop", "TEST": test}},
              {"default": {"ENGINE": MYSQL, "NAME": "test_shop", "TEST": test}})
    assert "its test database would be 'ci_shop'" in (refused() or "")


def test_a_test_name_equal_to_the_configured_name_is_refused(configure: Any) -> None:
    # Not renamed: nothing tells the test run's database from the one the settings name.
    test = {"NAME": "shop"}
    configure({"default": {"ENGINE": MYSQL, "NAME": "shop", "TEST": test}})
    assert refused() is not None


@pytest.mark.parametrize("name", [":memory:", "file:memorydb_default?mode=memory&cache=shared",
                                  "file:memorydb_default_3?mode=memory&cache=shared"])
def test_an_sqlite_database_in_memory_passes(configure: Any, name: str) -> None:
    configure({"default": {"ENGINE": SQLITE, "NAME": "/srv/shop.sqlite3"}},
              {"default": {"ENGINE": SQLITE, "NAME": name}})
    assert refused() is None


def test_an_sqlite_file_passes_only_as_the_test_file_or_its_clone(configure: Any) -> None:
    test = {"NAME": "/tmp/test-shop.sqlite3"}
    configured = {"default": {"ENGINE": SQLITE, "NAME": "/srv/shop.sqlite3", "TEST": test}}
    for name, passes in [("/tmp/test-shop.sqlite3", True), ("/tmp/test-shop_2.sqlite3", True),
                         ("/srv/shop.sqlite3", False), ("/tmp/test-shop.sqlite3x", False)]:
        configure(configured, {"default": {**configured["default"], "NAME": name}})
        assert (refused() is None) is passes, name
    configure({"default": {"ENGINE": SQLITE, "NAME": "/srv/shop.sqlite3"}})  # no TEST name
    assert "'/srv/shop.sqlite3' (alias 'default'), which Django's test setup did not " \
           "create:" in (refused() or "")


def test_names_given_as_paths_are_compared_as_text(configure: Any) -> None:
    test = {"NAME": Path("/tmp/test-shop.sqlite3")}
    configure({"default": {"ENGINE": SQLITE, "NAME": Path("/srv/shop.sqlite3"), "TEST": test}},
              {"default": {"ENGINE": SQLITE, "NAME": Path("/tmp/test-shop.sqlite3"),
                           "TEST": test}})
    assert refused() is None
    configure({"default": {"ENGINE": SQLITE, "NAME": Path("/srv/shop.sqlite3"), "TEST": test}})
    assert refused() is not None


def test_a_test_mirror_is_judged_by_the_database_it_mirrors(configure: Any) -> None:
    configured = {"default": {"ENGINE": POSTGRES, "NAME": "shop"},
                  "replica": {"ENGINE": POSTGRES, "NAME": "shop_replica",
                              "TEST": {"MIRROR": "default"}}}
    configure(configured)
    assert refused("replica") is not None
    configure(configured, {"default": {"ENGINE": POSTGRES, "NAME": "test_shop"},
                           "replica": {**configured["replica"], "NAME": "test_shop"}})
    assert refused("replica") is None
    # A mirror whose primary is not a test database is not one either.
    configure(configured, {"default": {"ENGINE": POSTGRES, "NAME": "shop"},
                           "replica": {**configured["replica"], "NAME": "shop"}})
    assert "'shop' (alias 'default')" in (refused("replica") or "")


def test_an_alias_added_after_the_start_is_refused(configure: Any) -> None:
    configure({"default": {"ENGINE": POSTGRES, "NAME": "shop"}},
              {"default": {"ENGINE": POSTGRES, "NAME": "test_shop"},
               "late": {"ENGINE": POSTGRES, "NAME": "test_late"}})
    assert "'test_late' (alias 'late')" in (refused("late") or "")


def test_the_first_names_remembered_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database_names, "_configured", {})
    database_names.remember_configured_names({"default": {"NAME": "shop"}})
    database_names.remember_configured_names({"default": {"NAME": "test_shop"}})
    assert database_names.configured_name("default") == "shop"
