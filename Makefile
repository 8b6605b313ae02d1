# Every command a contributor needs. The first two are the README's quickstart.
VENV ?= .venv
PY := $(VENV)/bin/python
PG_URL ?= postgres://postgres@127.0.0.1:5432/sqltasks
MYSQL_URL ?= mysql://root@127.0.0.1:3306/sqltasks
# make wheel-check drops and creates this database; PG_WHEEL_URL= checks SQLite only.
PG_WHEEL_URL ?= postgres://postgres@127.0.0.1:5432/sqltasks_wheel
# pytest-xdist: two pytest processes per core, each on a test database of its own (SQLite: a file
# each; PostgreSQL, MariaDB: test_sqltasks_gw0, ...). PYTEST_XDIST= runs them in one process.
# Two per core because the worker-process tests spend most of their time waiting for their
# workers; worksteal: a process that runs out of tests takes some of another's. On 2 cores,
# make test took 88 s with 4 processes, 93 s with 3, 111 s with 2 (and 120-130 s without
# worksteal), for the same 146-151 s of CPU.
PYTEST_XDIST ?= -n $(shell echo $$(( 2 * $$(nproc) ))) --dist worksteal
# Every worker process a test starts imports the package: let Python keep its bytecode, even on a
# machine that sets PYTHONDONTWRITEBYTECODE (0.1 s of CPU less for each; 15 s for make test).
unexport PYTHONDONTWRITEBYTECODE
# MARKERS="..." runs what pytest -m selects (the markers: pyproject.toml; CI's legs: .ci/run).
# make test runs what CI's SQLite leg runs but the index tests over large tables and the browser
# tests (CI's database legs run those), so a change's first check takes a minute and a half
# (CONTRIBUTING.md, "The tests"). make test-full runs every test but the load tests; the load
# tests (thousands of tasks through several workers) run apart: make test-load.
MARKERS ?= not load and not large_table and not browser and (not worker_process or worker_process_core)
FULL_MARKERS := not load
PYTEST_SELECT = $(PYTEST_XDIST) $(if $(MARKERS),-m "$(MARKERS)") $(PYTEST_ARGS)
# The inner loop: no worker process, load or browser test (scripts/mutations.sh runs the same).
FAST_MARKERS := not worker_process and not load

.PHONY: example wheel-check sql-snapshots test test-full test-load test-fast mutations venv test-postgres test-mariadb test-all test-django52 django-contract lint format migrations-check bench bench-smoke docs clean

example: venv  ## Run the example project end to end on SQLite: migrate, enqueue, work, show results
	$(PY) example_project/manage.py demo

wheel-check:  ## Build the sdist and wheel, check them, run the example on the installed wheel (SQLite, PostgreSQL at PG_URL)
	PG_URL=$(PG_WHEEL_URL) VENV=$(VENV) scripts/wheel_check.sh

test: venv  ## A change's first check: the test suite but what MARKERS leaves to CI (SQLite unless DATABASE_URL says otherwise)
	$(PY) -m pytest $(PYTEST_SELECT)

test-full: venv  ## Every test but the load tests: the large tables, the browsers, every worker-process test
	$(PY) -m pytest $(PYTEST_XDIST) -m "$(FULL_MARKERS)" $(PYTEST_ARGS)

test-load: venv  ## The load tests, in one process (each starts several workers of its own)
	$(PY) -m pytest -m load $(PYTEST_ARGS)

test-fast: venv  ## The tests of one process: no worker process, load or browser test
	$(PY) -m pytest $(PYTEST_XDIST) -m "$(FAST_MARKERS)" --ignore=tests/admin/browser $(PYTEST_ARGS)

mutations: venv  ## Break three behaviours on purpose, one at a time: test-fast must catch each
	scripts/mutations.sh

venv:
	@VENV=$(VENV) scripts/venv.sh

test-postgres: venv
	DATABASE_URL=$(PG_URL) $(PY) -m pytest $(PYTEST_SELECT)

test-mariadb:
	WITH_MYSQL=1 VENV=$(VENV) scripts/venv.sh
	DATABASE_URL=$(MYSQL_URL) $(PY) -m pytest $(PYTEST_SELECT)

test-all: test test-postgres test-mariadb test-django52

test-django52:  ## Django 5.2 with the django-tasks backport, on SQLite
	VENV=.venv-52 DJANGO=5.2 scripts/venv.sh
	.venv-52/bin/python -m pytest $(PYTEST_SELECT)

DJANGO_SRC ?= .cache/django-src
django-contract: venv  ## Django's own tests/tasks against this backend (downloads Django's source)
	@v=$$($(PY) -c "import django; print(django.__version__)"); \
	test -d $(DJANGO_SRC)/django-$$v || { \
	  $(PY) -m pip download "django==$$v" --no-binary :all: --no-deps -q -d $(DJANGO_SRC) && \
	  tar xzf $(DJANGO_SRC)/django-$$v.tar.gz -C $(DJANGO_SRC) "django-$$v/tests/tasks"; }; \
	$(PY) scripts/django_contract.py $(DJANGO_SRC)/django-$$v/tests/tasks

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check django_sqltasks tests scripts
	$(VENV)/bin/mypy django_sqltasks tests scripts
	$(VENV)/bin/lint-imports

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format django_sqltasks tests scripts

sql-snapshots: venv  ## Write every SQL statement of each database to sql/snapshots/ (the tests check them)
	$(PY) scripts/sql_snapshots.py

migrations-check: venv  ## Fail when the models and the committed migrations disagree
	$(PY) -m django makemigrations django_sqltasks --check --dry-run --settings tests.settings

bench:  ## The full side-by-side benchmark (about 30 minutes; see docs/benchmarks.md)
	WITH_BENCH=1 VENV=$(VENV) scripts/venv.sh
	$(PY) -m benchmarks run --probes 10 --http-requests 1000

bench-smoke:  ## A few hundred tasks through our PostgreSQL and SQLite rows and one peer; the latency of the bare-SQL floor and hand-over; the scale profile at 2,000 tasks; the mixed profile for a few seconds a phase (PostgreSQL, MariaDB, SQLite)
	WITH_BENCH=1 VENV=$(VENV) scripts/venv.sh
	$(PY) -m benchmarks run --smoke
	$(PY) -m benchmarks scale --smoke --database sqlite
	$(PY) -m benchmarks mixed --smoke
	$(PY) -m benchmarks mixed --smoke --database mariadb
	$(PY) -m benchmarks mixed --smoke --database sqlite --rate 30

docs:
	WITH_DOCS=1 VENV=$(VENV) scripts/venv.sh
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf .venv .venv-52 build dist *.egg-info tests/*.sqlite3*
