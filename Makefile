# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv and install first.
# `make test-fast` leaves out the tests marked slow (processes, torchrun, frameworks; see conftest.py).
# `make test-latest`: the suite on the newest release of every dependency (`make test-lowest`: on the
# lowest versions pyproject.toml allows); docs/install.md says which versions were tested.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

LATEST := .venv-latest
# The lower bounds of pyproject.toml (tokenizers 0.23.3: transformers 5.18 needs 0.23.1, and 0.23.1-0.23.2
# truncate pairs otherwise; docs/install.md). torch 2.6.0, like the newest torch, is a CUDA build of several GB.
LOWEST := .venv-lowest
LOWEST_VERSIONS := torch==2.6.0 torchdata==0.10.0 tokenizers==0.23.3 pyarrow==19.0.1 numpy==1.24.4 fsspec==2023.6.0 \
	tqdm==4.66.3 transformers==5.18.0 datasets==3.1.0 accelerate==1.3.0 lightning==2.5.0 s3fs==2023.6.0 matplotlib==3.8.0

.PHONY: demo test test-fast test-latest test-lowest bench setup lint

$(STAMP): pyproject.toml constraints-dev.txt
	@echo "padpipe: installing into $(VENV), a few minutes (once; torch is large)..."
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# CPU build of torch from the local wheel store; an unpinned torch may pull a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,torchtitan]' -c constraints-dev.txt
	# torchtitan 0.3.0 without its own requirements (datasets<4.8, tensorboard, wandb): docs/torchtitan.md;
	# dashscope only for the Qwen vocabulary file it ships (qwen.tiktoken: tests/tokenizer_fixtures.py, qwen())
	$(PY) -m pip install --quiet --no-deps -c constraints-dev.txt torchtitan dashscope
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m padpipe.demo

# The suite starts a few hundred Python processes (torchrun ranks, scripts, CLIs): each reads padpipe's and the
# tests' compiled bytecode instead of compiling them again, also where the environment turns bytecode writing off
# (the files go to __pycache__ folders, which git ignores).
unexport PYTHONDONTWRITEBYTECODE

# The test files are shared by $(JOBS) pytest-xdist processes; a file stays on one (its module fixtures run
# once). `make test JOBS=0` runs them in this process, one after another.
JOBS ?= 2
PYTEST = -m pytest -q -n $(JOBS) --dist loadfile

test: $(STAMP)
	$(PY) $(PYTEST)

test-fast: $(STAMP)
	$(PY) $(PYTEST) -m "not slow"

$(LATEST)/bin/python:
	$(PYTHON) -m venv $(LATEST) || python3 -m venv $(LATEST)
	$@ -m pip install --quiet --upgrade pip

# No constraints file: each run upgrades every dependency to its newest release that installs here
# (pip's own cap on this machine keeps torch at 2.14.1), then writes what it installed to versions.txt.
test-latest: $(LATEST)/bin/python
	$(LATEST)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager torch -e '.[dev]'
	$(LATEST)/bin/python -m pip freeze --exclude-editable > $(LATEST)/versions.txt
	$(LATEST)/bin/python $(PYTEST)

# Once per change of a lower bound (minutes of downloads): the fast tests and tests/integrations on the lowest
# versions; the venv is removed after.
test-lowest:
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST) || python3 -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install --quiet --upgrade pip
	$(LOWEST)/bin/python -m pip install --quiet $(LOWEST_VERSIONS) -e '.[dev]'
	$(LOWEST)/bin/python $(PYTEST) -m "not slow"
	$(LOWEST)/bin/python $(PYTEST) tests/integrations
	rm -rf $(LOWEST)

bench: $(STAMP)
	$(PY) benchmarks/throughput.py

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
