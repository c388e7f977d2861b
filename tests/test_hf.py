"""Hugging Face ``generate()`` compiled piecewise (examples/hf_generate.py):
tokens equal eager; a warm start in a fresh process compiles nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TESTS_DIR

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

EXAMPLE = TESTS_DIR.parent / "examples" / "hf_generate.py"


def _run(cache: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--cache", str(cache), "--new-tokens", "4"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_generate_tokens_equal_eager_and_warm_start_compiles_nothing(tmp_path: Path) -> None:
    cold = _run(tmp_path / "cache")
    assert cold["tokens_equal_eager"] is True
    assert isinstance(cold["inductor_compiles"], int) and cold["inductor_compiles"] > 0
    warm = _run(tmp_path / "cache")
    assert warm["tokens_equal_eager"] is True
    assert warm["inductor_compiles"] == 0 and warm["corrupt"] == 0, warm
    assert isinstance(warm["cache_hits"], int) and warm["cache_hits"] > 0
