# The two commands a newcomer needs (README.md):
#   make demo   install everything, then run the example shop on SQLite
#   make test   install everything, then lint, type-check, build the docs site in strict
#               mode, run the whole suite on SQLite, MariaDB/MySQL and PostgreSQL, then the
#               acceptance and browser tiers against the built wheel (the newest stack:
#               the newest Python and Django found); then the LTS stack (make test-lts).
#               The tiers run in three lanes at once, one per database server (below).
#               Not the soak and topology runs: make soak, make topologies
#   make docs   serve the docs site (MkDocs over docs/) at http://127.0.0.1:8000/en/latest/
PY := .venv/bin/python
# bash for the lanes' pipes (set -o pipefail)
SHELL := /bin/bash
# The second stack: Python 3.11 and Django 5.2 LTS (.ci/bootstrap lts).
LTS_PY := .venv-lts/bin/python
MYSQL_TEST_URL ?= mysql://root@127.0.0.1:3306/test
POSTGRES_TEST_URL ?= postgres://postgres@127.0.0.1:5432/test
LTS_TEST_URL ?= sqlite:////tmp/sqlqueue-lts-tests.sqlite3
DEMO_DB ?= sqlite:///$(CURDIR)/example_project/db.sqlite3
DOCS_SITE ?= site
# Material for MkDocs prints a notice about MkDocs 2.0 on every run: not a problem of ours.
export NO_MKDOCS_2_WARNING := 1

.PHONY: test-lane-sqlite test-lane-mysql test-lane-postgres bench-scale demo spark-demo test test-lts bootstrap bootstrap-lts lint docs docs-build test-sqlite test-mysql test-postgres test-postgres-server-binding test-spark test-wheel soak topologies bench bench-quick docs-images

bootstrap:
	@./.ci/bootstrap

bootstrap-lts:
	@./.ci/bootstrap lts

demo: bootstrap
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py migrate -v 0
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py demo

# The shop's traffic, then the Spark analytics job in local mode (needs Java 17+).
spark-demo: bootstrap
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py migrate -v 0
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py spark_demo

lint: bootstrap
	$(PY) -m ruff check .
	$(PY) -m mypy

# The docs site with live reload (the docs extra, installed by bootstrap).
docs: bootstrap
	$(PY) -m mkdocs serve

# The strict build: a dead link, a missing anchor or a page left out of the nav fails it.
# Into $(DOCS_SITE) (site/, ignored by git).
docs-build: bootstrap
	$(PY) -m mkdocs build --strict --site-dir $(DOCS_SITE)

# Which tier runs what. Each test runs on every database its outcome can depend on, and
# once when it can depend on none (CI's 90 minutes; README.md, "Development", has the times):
# - test-sqlite: the unit, integration and Spark tiers from the checkout, and of the
#   acceptance and browser tiers only what needs the checkout (marker `checkout`: building
#   the package, the benchmark suite). The rest of those two tiers runs on SQLite in
#   test-wheel, against the built wheel: the stricter run of the same tests (the package as
#   users install it, from a copy of the tests beside no source tree), so running them from
#   the checkout as well only repeated 5 minutes. The LTS stack runs the browser tier and a
#   newcomer's acceptance tests from the checkout.
# - test-mysql, test-postgres: every tier but the tests marked `database_independent`
#   (pyproject.toml): the unit tier (no database), and tests that make a database of their
#   own (the Quickstart's project, the demo, the example project's tests, the pytest
#   plugin's project, the package build): run on SQLite only, since DATABASE_URL changes
#   nothing for them. tests/conftest.py refuses that marker on a test that uses the test
#   database. A PYTEST_ARGS with its own -m replaces a tier's selection.
# SQLQUEUE_REQUIRE_SPARK=1, SQLQUEUE_REQUIRE_DOCS=1: the Spark and docs-site tests fail
# rather than skip when PySpark, Java or MkDocs is missing, so that CI cannot skip them
# silently.
SQLITE_TIER := not soak and not topology and (checkout or not (acceptance or browser))
SERVER_TIER := not soak and not topology and not database_independent
test-sqlite: bootstrap
	SQLQUEUE_REQUIRE_SPARK=1 SQLQUEUE_REQUIRE_DOCS=1 DATABASE_URL=sqlite:////tmp/sqlqueue-tests.sqlite3 $(PY) -m pytest -m "$(SQLITE_TIER)" $(PYTEST_ARGS)

test-mysql: bootstrap
	SQLQUEUE_REQUIRE_SPARK=1 SQLQUEUE_REQUIRE_DOCS=1 DATABASE_URL=$(MYSQL_TEST_URL) $(PY) -m pytest -m "$(SERVER_TIER)" $(PYTEST_ARGS)

test-postgres: bootstrap
	SQLQUEUE_REQUIRE_SPARK=1 SQLQUEUE_REQUIRE_DOCS=1 DATABASE_URL=$(POSTGRES_TEST_URL) $(PY) -m pytest -m "$(SERVER_TIER)" $(PYTEST_ARGS)

# The integration tier again on PostgreSQL with Django's server-side parameter binding
# and psycopg's prepared statements (OPTIONS {"server_side_binding": True,
# "prepare_threshold": 0}): every statement must give the server the types it cannot
# infer, and each is prepared on its first run.
test-postgres-server-binding: bootstrap
	SQLQUEUE_TEST_SERVER_SIDE_BINDING=1 DATABASE_URL=$(POSTGRES_TEST_URL) $(PY) -m pytest -m "not soak" tests/integration $(PYTEST_ARGS)

# Only the Spark pipeline's tests (local-mode PySpark), on MariaDB/MySQL, PostgreSQL and SQLite.
test-spark: bootstrap
	SQLQUEUE_REQUIRE_SPARK=1 DATABASE_URL=$(MYSQL_TEST_URL) $(PY) -m pytest -m spark $(PYTEST_ARGS)
	SQLQUEUE_REQUIRE_SPARK=1 DATABASE_URL=$(POSTGRES_TEST_URL) $(PY) -m pytest -m spark $(PYTEST_ARGS)
	SQLQUEUE_REQUIRE_SPARK=1 DATABASE_URL=sqlite:////tmp/sqlqueue-tests.sqlite3 $(PY) -m pytest -m spark $(PYTEST_ARGS)

# The admin screenshots the guides show (docs/images/admin-13..20), taken again by the
# browser tests at 1366 px, and those of the custom pages on each stack's Django (19, 20).
docs-images: bootstrap bootstrap-lts
	SQLQUEUE_REFRESH_DOCS_IMAGES=1 DATABASE_URL=sqlite:////tmp/sqlqueue-docs-images.sqlite3 \
		$(PY) -m pytest tests/browser -k "laptop_width or styled_like or retried_from_its_page or drain_and_stop or created_and_ticked or shows_and_refreshes" $(PYTEST_ARGS)
	SQLQUEUE_REFRESH_DOCS_IMAGES=1 DATABASE_URL=sqlite:////tmp/sqlqueue-docs-images.sqlite3 \
		$(LTS_PY) -m pytest -p no:cacheprovider tests/browser -k "styled_like or retried_from_its_page or drain_and_stop or created_and_ticked or shows_and_refreshes" $(PYTEST_ARGS)

# The built wheel installed in a fresh virtualenv: acceptance and browser tiers against it
# on SQLite (all but the tests marked `checkout`), the only run of those on SQLite.
test-wheel: bootstrap
	./.ci/test-wheel

# Django 5.2 LTS on Python 3.11, on SQLite: the unit and integration tiers, the browser
# tier (the admin's markup differs between Django 5.2 and 6) and the acceptance tests of
# a newcomer's first hour from the checkout; then the wheel built on that Python, in a
# fresh virtualenv with Django 5.2, against the Quickstart, first-contact and browser
# tests (README.md, "Development", says why this split).
LTS_TESTS := tests/unit tests/integration tests/browser tests/acceptance/test_first_contact.py \
	tests/acceptance/test_quickstart.py tests/acceptance/test_runconsumer.py \
	tests/acceptance/test_tasks_worker.py
LTS_WHEEL_TESTS := tests/acceptance/test_quickstart.py tests/acceptance/test_first_contact.py \
	tests/browser
test-lts: bootstrap-lts
	DATABASE_URL=$(LTS_TEST_URL) $(LTS_PY) -m pytest -m "not soak and not spark" \
		-p no:cacheprovider $(LTS_TESTS) $(PYTEST_ARGS)
	SQLQUEUE_WHEEL_VENV=.venv-lts SQLQUEUE_WHEEL_PIP="django>=5.2,<5.3 django-tasks>=0.8" \
		SQLQUEUE_WHEEL_TESTS="$(LTS_WHEEL_TESTS)" ./.ci/test-wheel $(LTS_TEST_URL)

# The tiers in three lanes at once, one per database server, each lane's tiers one after
# another: the tests mostly wait (on runners' polls, subprocesses, Chromium; about a fifth
# of a core each), so on two cores the lanes take about as long as the longest one instead
# of the sum. A lane never shares a server with another: the write horizon each runner
# reads is the whole server's (MariaDB's INNODB_TRX, PostgreSQL's snapshot xmin), so two
# tiers on one server would hold each other's runners back. Each line is prefixed with
# its lane; a lane stops at its first failing tier (make -k: goes on).
test: lint docs-build bootstrap-lts
	@$(MAKE) --no-print-directory -j3 test-lane-sqlite test-lane-mysql test-lane-postgres

lane = @set -o pipefail; $(MAKE) --no-print-directory -j1 $(2) 2>&1 | sed -u 's/^/[$(1)] /'
test-lane-sqlite:
	$(call lane,sqlite,test-sqlite test-wheel test-lts)
test-lane-mysql:
	$(call lane,mysql,test-mysql)
test-lane-postgres:
	$(call lane,postgres,test-postgres test-postgres-server-binding)

# The topology report's runs (docs/guides/topologies.md), with their figures printed: the
# ones marked `topology` (a minute or more each, left out of make test for CI's time) and
# `soak` included: servers of the tests' own (MariaDB replicas, a Galera cluster,
# a Patroni + etcd cluster: bootstrap installs Debian's patroni and etcd-server for it;
# a Spark standalone master with two workers).
topologies:
	@SQLQUEUE_BOOTSTRAP_TOPOLOGIES=1 ./.ci/bootstrap
	SQLQUEUE_REQUIRE_SPARK=1 DATABASE_URL=$(MYSQL_TEST_URL) $(PY) -m pytest -s -m "" \
		tests/acceptance/test_failover.py tests/acceptance/test_async_failover.py \
		tests/acceptance/test_semisync.py tests/acceptance/test_galera.py \
		tests/acceptance/test_patroni.py tests/spark/test_cluster.py $(PYTEST_ARGS)

# Long fault run with its history checked, not part of `make test`
# (docs/guides/operations.md): on a database server of its own (SOAK_DATABASE=mariadb or
# postgresql), restarted half-way; never the shared one.
soak: bootstrap
	$(PY) -m bench.soak --database $(or $(SOAK_DATABASE),mariadb) --minutes $(or $(SOAK_MINUTES),2) \
		--messages $(or $(SOAK_MESSAGES),20000) --kills $(or $(SOAK_KILLS),5) \
		--pauses $(or $(SOAK_PAUSES),1) --freezes $(or $(SOAK_FREEZES),1) $(SOAK_ARGS)

# The benchmark suite with the peers side by side (bench/README.md); needs MariaDB,
# PostgreSQL and Redis. Results in bench/results/ (results.md, results.json, plots).
bench: bootstrap
	$(PY) -m pip install -q -e ".[mysql,postgresql,bench]"
	$(PY) -m bench.suite $(BENCH_ARGS)
	$(MAKE) bench-scale

# A log of millions (issue 52, docs/benchmarks.md): publish, drain and garbage collection
# (with live traffic's latency) beside backlogs of 0, 1M and 10M messages, then every admin
# page on a log of 10M; on MariaDB and PostgreSQL. An hour or more: part of `make bench`,
# never of `make test`. SCALE_SIZES=0,1000000 for a shorter run.
SCALE_SIZES ?= 0,1000000,10000000
SCALE_MYSQL_URL ?= mysql://root@127.0.0.1:3306/sqlqueue_bench_scale
SCALE_PG_URL ?= postgres://postgres@127.0.0.1:5432/sqlqueue_bench_scale
comma := ,
SCALE_LARGEST = $(lastword $(subst $(comma), ,$(SCALE_SIZES)))
bench-scale:
	mkdir -p bench/results
	$(PY) -m bench.scale --url $(SCALE_MYSQL_URL) --sizes $(SCALE_SIZES) \
		--json bench/results/scale-mysql.json --plot bench/results/scale-mysql.png
	$(PY) -m bench.scale --url $(SCALE_PG_URL) --sizes $(SCALE_SIZES) \
		--json bench/results/scale-postgresql.json --plot bench/results/scale-postgresql.png
	$(PY) -m bench.admin_scale --url $(SCALE_MYSQL_URL) --load \
		--messages $(SCALE_LARGEST) --json > bench/results/admin-scale-mysql.json
	$(PY) -m bench.admin_scale --url $(SCALE_PG_URL) --load \
		--messages $(SCALE_LARGEST) --json > bench/results/admin-scale-postgresql.json

bench-quick: bootstrap
	$(PY) -m pip install -q -e ".[mysql,postgresql,bench]"
	$(PY) -m bench.suite --quick $(BENCH_ARGS)
