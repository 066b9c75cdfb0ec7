# Two commands on a fresh machine:  make run  (the main job)  and  make test  (the test suite).
# Both create ./.venv, install requirements into it and build the compiled engine first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast engine lint bench clean

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

# The compiled planning engine (C++, pybind11, the machine's g++). Without a compiler it says so
# and the pure-Python engine runs instead (docs/engine.md).
engine: $(STAMP)
	$(PY) -m pipeline._native.build

run: engine
	$(PY) -m experiments search

test: engine
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n auto --maxprocesses=4 --durations=30

# The unit tests without the slow ones (torchrun jobs, training, the docs' commands, long searches):
# about a minute on 2 cores. `make test` (CI) still runs everything.
test-fast: engine
	$(PY) -m pytest -q -n auto --maxprocesses=4 -m "not slow"

bench: engine
	$(PY) -m experiments.benchmarks.engine_speed

clean:
	rm -rf $(VENV) runs .pytest_cache pipeline/_engine*.so
