# Two set-up commands (see README.md): `make demo` and `make test`.
# Everything is installed into ./.venv; nothing outside the repo is touched except the
# data cache in ~/.cache/bert-keras.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip

.PHONY: demo test test-integration test-all venv venv-dev clean

# The tests run in this many processes, a test file per process at a time (pytest-xdist):
# most of a test's time is single-threaded Python (imports, tracing), so 2 on 2 cores take
# about 0.7 of the time of 1 (BUILD_NOTES 8.5). `make test TEST_WORKERS=0` runs them all in one process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# constraints.txt pins every package to the versions the suites last passed with (its header
# says how it is regenerated); requirements*.txt keep the supported ranges.
$(VENV)/.runtime-stamp: requirements.txt constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt -c constraints.txt
	$(PIP) install -q --no-deps -e .
	touch $@

$(VENV)/.dev-stamp: $(VENV)/.runtime-stamp requirements-dev.txt constraints.txt
	$(PIP) install -q -r requirements-dev.txt -c constraints.txt
	touch $@

venv: $(VENV)/.runtime-stamp
venv-dev: $(VENV)/.dev-stamp

## The main job: the end-to-end demo on the embedded default.
demo: venv
	$(PY) scripts/quickstart.py

## The default test suite (slow and integration tests excluded; see pyproject.toml markers).
test: venv-dev
	$(PY) -m pytest -q $(XDIST)

## The end-to-end runs in fresh processes (CI runs them after the default suite); those also
## marked slow are left to test-all.
test-integration: venv-dev
	$(PY) -m pytest -q $(XDIST) -m "integration and not slow"

## Everything, slow tests included.
test-all: venv-dev
	$(PY) -m pytest -q $(XDIST) -m ""

clean:
	rm -rf $(VENV) build *.egg-info
