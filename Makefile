# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv and install first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench setup

$(STAMP): pyproject.toml constraints-dev.txt
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

bench: $(STAMP)
	$(PY) benchmarks/throughput.py
