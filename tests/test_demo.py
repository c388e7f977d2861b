"""The main job (`make demo` runs `python -m fxpiece demo`), on a tiny model:
a cold and a warm process, outputs checked against eager."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_runs_cold_then_warm_and_matches_eager(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "fxpiece", "demo", "--cache-dir", str(tmp_path / "cache")]
    cmd += ["--layers", "1", "--hidden", "64", "--max-tokens", "32"]
    cmd += ["--reps", "2", "--latency-sizes", "1,4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout
    assert proc.returncode == 0, (out, proc.stderr[-3000:])
    assert "outputs match eager" in out, out
    assert re.search(r"start path\s+aot-capture\s+aot-load", out), out
    compiles = re.search(r"Inductor compiles\s+(\d+)\s+(\d+)", out)
    assert compiles is not None, out
    assert int(compiles.group(1)) > 0 and int(compiles.group(2)) == 0, out
    # The latency table has a row per size asked for.
    assert re.search(r"^1\s+[\d.]+\s+[\d.]+\s+[\d.]+x$", out, re.M), out
    assert re.search(r"^4\s+[\d.]+\s+[\d.]+\s+[\d.]+x$", out, re.M), out
