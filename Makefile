# The two set-up-and-go commands are `make demo` and `make test` (see README).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test install lint rust-test py-test bench

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Builds the Rust extension (maturin) and installs fxpiece with torch and the dev tools.
install: $(PY)
	$(PY) -m pip install --quiet -e ".[dev]"

rust-test:
	cargo test --release
	cargo clippy --release --all-targets -- -D warnings
	cargo clippy --release --all-targets --features extension-module -- -D warnings
	cargo fmt --check

lint: install
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	$(VENV)/bin/mypy

py-test: install
	$(PY) -m pytest -q --durations=15

test: install rust-test lint py-test

demo: install
	$(PY) -m fxpiece demo

bench: install
	$(PY) benches/bench_hash.py
	$(PY) benches/bench_index.py
