# Set-up and entry points. `make demo`, `make check` and `make test` each create .venv on first use,
# install the CPU build of torch first (a bare `torch` requirement would download a multi-GB CUDA
# build), then this project, then run. `make check` is the fast subset (tests not marked `slow`, the mark
# of every test over 2 s: about 45 s with -n 2 on 2 cores); `make test` is the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo check test test-torch-ops bench clean

$(BIN)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/python -m fixtures.demo

check: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# the real-model tests on the torch-op path (no native op: backward.py's Python hooks and graph walk), the
# path of accelerators and of a torch the op does not build on (tests/realworld/test_torch_op_path.py)
test-torch-ops: setup
	MSPROBE_NATIVE_STATS=0 $(BIN)/python -m pytest -q tests/realworld $(PYTEST_ARGS)

bench: setup
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) demo-output
