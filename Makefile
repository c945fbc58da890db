# twinserve — the two commands of the README, plus helpers.
#   make demo   sets up .venv (core + simulator + reports), compiles the simulator's hot modules
#               with mypyc where a C compiler and the Python headers are present (else says so
#               in one line and runs the sources), and runs the embedded default simulation
#   make test   sets up .venv (everything, incl. torch CPU + triton, the server) and runs the tests
#               (on the Python sources; one test compiles a copy of the tree and checks it)
#   make fast   (re)compiles the hot modules; make clean-compiled goes back to the sources
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP_SIM  := $(VENV)/.stamp-sim
STAMP_ALL  := $(VENV)/.stamp-all

.PHONY: demo test test-all lint fast clean-compiled clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP_SIM): pyproject.toml Makefile | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[sim,fast]'
	touch $@

$(STAMP_ALL): pyproject.toml Makefile | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[sim,real,serve,test,dev,fast]'
	touch $@ $(STAMP_SIM)

demo: $(STAMP_SIM)
	$(VENV)/bin/twinserve compile --auto
	$(VENV)/bin/twinserve simulate

test: $(STAMP_ALL)
	$(PY) -m pytest

test-all: $(STAMP_ALL)
	$(PY) -m pytest -m "slow or not slow"

lint: $(STAMP_ALL)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

fast: $(STAMP_SIM)
	$(VENV)/bin/twinserve compile

clean-compiled:
	find engine sim -name '*.so' -delete -o -name _compiled.json -delete
	rm -rf build/mypyc

clean: clean-compiled
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
