# The two commands a newcomer needs (README.md):
#   make demo   install everything, then run the example shop on SQLite
#   make test   install everything, then lint, type-check and run the whole suite
#               on SQLite and on MariaDB/MySQL
PY := .venv/bin/python
MYSQL_TEST_URL ?= mysql://root@127.0.0.1:3306/test
DEMO_DB ?= sqlite:///$(CURDIR)/example_project/db.sqlite3

.PHONY: demo spark-demo test bootstrap lint test-sqlite test-mysql test-spark soak bench bench-quick

bootstrap:
	@./.ci/bootstrap

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

# SQLQUEUE_REQUIRE_SPARK=1: the Spark tests fail rather than skip when PySpark or Java
# is missing, so that CI cannot skip them silently.
test-sqlite: bootstrap
	SQLQUEUE_REQUIRE_SPARK=1 DATABASE_URL=sqlite:////tmp/sqlqueue-tests.sqlite3 $(PY) -m pytest -m "not soak" $(PYTEST_ARGS)

test-mysql: bootstrap
	SQLQUEUE_REQUIRE_SPARK=1 DATABASE_URL=$(MYSQL_TEST_URL) $(PY) -m pytest -m "not soak" $(PYTEST_ARGS)

# Only the Spark pipeline's tests (local-mode PySpark), on MariaDB/MySQL and on SQLite.
test-spark: bootstrap
	SQLQUEUE_REQUIRE_SPARK=1 DATABASE_URL=$(MYSQL_TEST_URL) $(PY) -m pytest -m spark $(PYTEST_ARGS)
	SQLQUEUE_REQUIRE_SPARK=1 DATABASE_URL=sqlite:////tmp/sqlqueue-tests.sqlite3 $(PY) -m pytest -m spark $(PYTEST_ARGS)

test: lint test-sqlite test-mysql

# Long fault run, not part of `make test` (docs/guides/operations.md); needs MariaDB.
soak: bootstrap
	$(PY) -m bench.soak --minutes $(or $(SOAK_MINUTES),2) --messages $(or $(SOAK_MESSAGES),20000) --kills $(or $(SOAK_KILLS),5)

# The benchmark suite with the peers side by side (bench/README.md); needs MariaDB and
# Redis. Results in bench/results/ (results.md, results.json, plots).
bench: bootstrap
	$(PY) -m pip install -q -e ".[mysql,bench]"
	$(PY) -m bench.suite $(BENCH_ARGS)

bench-quick: bootstrap
	$(PY) -m pip install -q -e ".[mysql,bench]"
	$(PY) -m bench.suite --quick $(BENCH_ARGS)
