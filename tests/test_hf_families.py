"""Decoder families through the README's ``generate()`` recipe, each from a
tiny config: tokens equal eager cold and warm, the warm start (a fresh
process) compiles nothing and loads ahead of time. Phi-3's fused qkv makes
the attention op return another layout than its fake (it crashed inside a
compiled piece before the boundary layouts were conformed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TESTS_DIR

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

PROGRAM = TESTS_DIR / "programs" / "hf_family.py"


def _run(family: str, cache: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), family, "--cache", str(cache)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("family", ["phi3", "mixtral"])
def test_family_generates_like_eager_and_warm_starts_without_compiling(
    family: str, tmp_path: Path
) -> None:
    cold = _run(family, tmp_path / "cache")
    assert cold["tokens_equal_eager"] is True, cold
    assert isinstance(cold["inductor_compiles"], int) and cold["inductor_compiles"] > 0, cold
    warm = _run(family, tmp_path / "cache")
    assert warm["tokens_equal_eager"] is True, warm
    assert warm["inductor_compiles"] == 0 and warm["start"] == "aot-load", warm
