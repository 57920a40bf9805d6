# Two set-up commands (see README.md): `make demo` and `make test`.
# Everything is installed into ./.venv; nothing outside the repo is touched except the
# data cache in ~/.cache/bert-keras.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip

.PHONY: demo test test-integration test-all venv venv-dev clean

$(VENV)/.runtime-stamp: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps -e .
	touch $@

$(VENV)/.dev-stamp: $(VENV)/.runtime-stamp requirements-dev.txt
	$(PIP) install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.runtime-stamp
venv-dev: $(VENV)/.dev-stamp

## The main job: the end-to-end demo on the embedded default.
demo: venv
	$(PY) scripts/quickstart.py

## The default test suite (slow and integration tests excluded; see pyproject.toml markers).
test: venv-dev
	$(PY) -m pytest -q

## The end-to-end runs in fresh processes (CI runs them after the default suite).
test-integration: venv-dev
	$(PY) -m pytest -q -m integration

## Everything, slow tests included.
test-all: venv-dev
	$(PY) -m pytest -q -m ""

clean:
	rm -rf $(VENV) build *.egg-info
