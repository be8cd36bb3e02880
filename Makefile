# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv and install first.
# `make test-fast` leaves out the tests marked slow (processes, torchrun, frameworks; see conftest.py).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench setup lint

$(STAMP): pyproject.toml constraints-dev.txt
	@echo "padpipe: installing into $(VENV), a few minutes (once; torch is large)..."
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# CPU build of torch from the local wheel store; an unpinned torch may pull a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]' -c constraints-dev.txt
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m padpipe.demo

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/throughput.py

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
