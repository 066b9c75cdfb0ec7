# Two commands on a fresh machine:  make run  (the main job)  and  make test  (the test suite).
# Both create ./.venv and install requirements into it first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m experiments search

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m experiments.benchmarks.simulator_speed

clean:
	rm -rf $(VENV) runs .pytest_cache
