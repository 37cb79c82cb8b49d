# `make test` and `make demo` each build .venv from scratch when it is missing or stale.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo lint typecheck unit bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is an optional extra; the CPU build 2.13.0 when none is installed.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,torch,fuse]'
	# Debian's chromium for the browser tests (Playwright drives /usr/bin/chromium).
	command -v chromium >/dev/null || (apt-get update && apt-get install -y --no-install-recommends chromium)
	# Debian's tcpdump for the opt-in net collector (its test captures a loopback transfer).
	command -v tcpdump >/dev/null || (apt-get update && apt-get install -y --no-install-recommends tcpdump)
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -n auto

test: lint typecheck unit

demo: $(STAMP)
	$(VENV)/bin/perfswarm demo

# Every benchmark script, one after the other (each prints its own ratios; see docs/benchmarks.md).
bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
