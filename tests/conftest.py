"""Shared fixtures: cache folders, subprocess runs (warm starts), Dynamo reset.

This conftest applies to ``tests/core`` too, which runs where importing torch
is impossible: nothing here imports torch. The toy-model helpers live in
:mod:`programs.toy` (they import torch); ``from conftest import make_toy``
still works and imports them on first use."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from programs.report import RESULT_MARK, counter_diff, keep_logs
from programs.run import PRELUDE, TESTS_DIR, PyRunner, run_toy_subprocess

__all__ = [
    "NOBODY",
    "PRELUDE",
    "RESULT_MARK",
    "TESTS_DIR",
    "PyRunner",
    "as_nobody",
    "counter_diff",
    "keep_logs",
    "run_toy_subprocess",
    "snapshot_files",
]

# Imported from programs.toy on first use (PEP 562): they need torch.
_TOY = ("RecordRange", "make_toy", "run_toy", "token_ids")


def __getattr__(name: str) -> Any:
    if name in _TOY:
        from programs import toy

        return getattr(toy, name)
    raise AttributeError(f"module 'conftest' has no attribute {name!r}")


@pytest.fixture(scope="session", autouse=True)
def _private_inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Inductor's default cache (used when our cache is off) goes to a
    session folder, so runs never depend on /tmp/torchinductor_<user>."""
    keys = ("TORCHINDUCTOR_CACHE_DIR", "FXPIECE_CACHE_ROOT")
    old = {k: os.environ.get(k) for k in keys}
    base = tmp_path_factory.mktemp("session-caches")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(base / "inductor-default")
    os.environ["FXPIECE_CACHE_ROOT"] = str(base / "fxpiece-default")
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session", autouse=True)
def _private_signing_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The builder key and trusted keys of every test (and of the processes
    tests start: they inherit the environment) live in a session folder,
    never in the user's ~/.config: XDG_CONFIG_HOME points there and the
    FXPIECE_KEY_FILE / FXPIECE_TRUSTED_KEYS(_FILE) the user may have set are
    unset. Tests that need their own keys override these per test."""
    keys = (
        "XDG_CONFIG_HOME",
        "FXPIECE_KEY_FILE",
        "FXPIECE_TRUSTED_KEYS",
        "FXPIECE_TRUSTED_KEYS_FILE",
    )
    old = {k: os.environ.get(k) for k in keys}
    for k in keys:
        os.environ.pop(k, None)
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("session-config"))
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Iterator[None]:
    """Dynamo starts and ends every test reset (if torch is loaded at all:
    a test that never imported torch has no Dynamo state)."""
    if "torch" in sys.modules:
        sys.modules["torch"]._dynamo.reset()
    yield
    if "torch" in sys.modules:
        sys.modules["torch"]._dynamo.reset()


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    """A fresh cache root (not created yet: the backend creates it)."""
    return tmp_path / "fxpiece-cache"


@pytest.fixture(scope="session")
def run_py() -> PyRunner:
    return PyRunner()


NOBODY = 65534
"""The uid and gid another user acts as in attack tests (``setpriv``)."""


def as_nobody(code: str) -> None:
    """Run ``code`` (Python) as uid/gid 65534."""
    subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


def snapshot_files(root: Path) -> list[str]:
    """Every file under ``root`` (relative), or [] if it does not exist."""
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
