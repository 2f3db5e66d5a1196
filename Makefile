# The two commands a newcomer needs (README.md):
#   make demo   install everything, then run the example shop on SQLite
#   make test   install everything, then lint, type-check and run the whole suite
#               on SQLite and on MariaDB/MySQL
PY := .venv/bin/python
MYSQL_TEST_URL ?= mysql://root@127.0.0.1:3306/test
DEMO_DB ?= sqlite:///$(CURDIR)/example_project/db.sqlite3

.PHONY: demo test bootstrap lint test-sqlite test-mysql soak bench bench-quick

bootstrap:
	@./.ci/bootstrap

demo: bootstrap
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py migrate -v 0
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py demo

lint: bootstrap
	$(PY) -m ruff check .
	$(PY) -m mypy

test-sqlite: bootstrap
	DATABASE_URL=sqlite:////tmp/sqlqueue-tests.sqlite3 $(PY) -m pytest -m "not soak" $(PYTEST_ARGS)

test-mysql: bootstrap
	DATABASE_URL=$(MYSQL_TEST_URL) $(PY) -m pytest -m "not soak" $(PYTEST_ARGS)

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
