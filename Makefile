# Lakecast: two commands on a fresh clone.
#   make demo   runs the main job on the embedded default (local Spark, var/lake, SQLite Dagster)
#   make test   runs the test suite (and ruff); installs Debian's chromium for the browser test
# Both bootstrap the environment (venv, pinned deps, Delta JARs) on first use, idempotently.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEPS   := $(VENV)/.lakecast-deps

export DAGSTER_HOME ?= $(CURDIR)/var/dagster_home
# demo and ui run Spark on the project's Lakecast Spark server (started on demand, kept
# running so that runs find their state warm; `make server-stop` stops it). Set it
# empty for Spark inside each process: `make demo LAKECAST_SPARK_REMOTE=`.
LAKECAST_SPARK_REMOTE ?= server

.PHONY: setup jars browser demo test lint ui bench clean clean-lake lock server-start server-stop \
	server-status postgres prod-up prod-down prod-status cluster-up cluster-down cluster-status \
	bench-cluster docs docs-serve

setup: $(DEPS) jars

$(DEPS): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Lakecast needs Python >= 3.11, found " + sys.version' 
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "==> installing pinned Python dependencies into $(VENV)"
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $@

# Delta's JARs, once, into the shared JAR cache (lakecast.config: LAKECAST_JARS_DIR);
# a no-op when they are there
jars: $(DEPS)
	@$(VENV)/bin/lakecast setup

# The browser test (tests/ui) drives Debian's chromium through Playwright (Playwright's own
# browser download is not reachable here). Installed once; nothing to do when on PATH.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "==> installing Debian's chromium for the browser test (apt-get)"; \
	  apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
	  echo "could not install chromium: the browser test (tests/ui) will fail"

# PostgreSQL server binaries from Debian's packages, for the production Dagster stack
# (deploy/prod_stack.py) and its test; installed once (no cluster of the package's own:
# the stack runs its server from its own data folder under var/).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  echo "==> installing PostgreSQL (apt-get install -y postgresql)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO mkdir -p /etc/postgresql-common/createcluster.d && \
	  echo "create_main_cluster = false" | \
	    $$SUDO tee /etc/postgresql-common/createcluster.d/lakecast.conf >/dev/null && \
	  $$SUDO apt-get update -q && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; }

demo: setup
	@LAKECAST_SPARK_REMOTE=$(LAKECAST_SPARK_REMOTE) $(PY) -m jobs.demo

test: setup browser postgres
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/pytest -q

lint: $(DEPS)
	@$(VENV)/bin/ruff check .

ui: setup
	@mkdir -p "$(DAGSTER_HOME)"
	@test -f "$(DAGSTER_HOME)/dagster.yaml" || cp deploy/dagster/dagster.yaml "$(DAGSTER_HOME)/dagster.yaml"
	@if [ "$(LAKECAST_SPARK_REMOTE)" = server ]; then $(VENV)/bin/lakecast server start; fi
	@LAKECAST_SPARK_REMOTE=$(LAKECAST_SPARK_REMOTE) $(PY) -m jobs.ui -p 3000

server-start: setup
	@$(VENV)/bin/lakecast server start

server-stop:
	@$(VENV)/bin/lakecast server stop

server-status:
	@$(VENV)/bin/lakecast server status

# the production Dagster stack: PostgreSQL + dagster-daemon + dagster-webserver (deploy/README.md)
prod-up: setup postgres
	@$(PY) -m deploy.prod_stack up

prod-down:
	@$(PY) -m deploy.prod_stack down

prod-status:
	@$(PY) -m deploy.prod_stack status

# A local Spark standalone cluster (master + 2 workers on 127.0.0.1, logs in var/cluster/)
# whose driver is the Lakecast Spark server; `make demo` and `make ui` then run on it.
cluster-up: setup
	@$(VENV)/bin/lakecast cluster up

cluster-down:
	@$(VENV)/bin/lakecast cluster down

cluster-status:
	@$(VENV)/bin/lakecast cluster status

bench-cluster: setup
	@$(PY) -m benchmarks.cluster

# every benchmark, each judged against its pre-registered targets (benchmarks/targets.py):
# PASS/FAIL per measure, JSON in benchmarks/results/<name>.json. Run it on a quiet machine.
BENCHMARKS ?= delta_log_poll broadcast_enrichment keyed_state snapshots pipeline \
	sensor_freshness freshness cluster soak
bench: setup
	@status=0; for b in $(BENCHMARKS); do echo "== benchmarks.$$b"; \
		$(PY) -m benchmarks.$$b || status=1; done; exit $$status

lock: $(DEPS)
	@{ head -2 constraints.txt; $(PY) -m pip freeze --exclude-editable; } > constraints.txt.new && mv constraints.txt.new constraints.txt

clean-lake:
	rm -rf var/lake var/checkpoints var/warehouse var/dagster_home

clean: clean-lake
	rm -rf $(VENV) var

# The docs site (mkdocs.yml; generated reference pages: docs/hooks.py) into site/;
# tests/docs runs the same strict build as part of `make test`
# SITE_DIR: where the site goes (tests/docs builds it into a temporary folder)
SITE_DIR ?= site
docs: $(DEPS)
	@NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q -d "$(SITE_DIR)"

docs-serve: $(DEPS)
	@NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a 127.0.0.1:8000
