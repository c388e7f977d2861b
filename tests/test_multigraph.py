"""Multi-graph models: artifacts are shared by digest across Dynamo graphs,
never replaced, so a warm start compiles nothing and finds nothing corrupt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PyRunner


def _run(run_py: PyRunner, cache: Path) -> dict[str, Any]:
    result: dict[str, Any] = run_py.program("mm_shared", cache)
    return result


@pytest.mark.slow
def test_shared_piece_warm_start_compiles_nothing(run_py: PyRunner, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold = _run(run_py, cache)
    assert cold["ok"], cold
    assert cold["keys"][0] != cold["keys"][1], "two graphs, two model keys"
    # f: sin piece + add piece; g: the sin piece is the same digest (loaded
    # from f's artifact), only the sub piece compiles.
    assert cold["num_inductor_compiles"] == 3, cold
    assert cold["num_corrupt_artifacts"] == 0
    # g's index points at the shared artifact too (not only f's).
    listing = json.loads(
        subprocess.run(
            [sys.executable, "-m", "fxpiece", "cache", "ls", "--json", str(cache)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    digests = {
        m["key"]: {e["digest"] for e in m["entries"]}
        for m in listing["models"]
        if m["key"] in cold["keys"]
    }
    assert sorted(len(d) for d in digests.values()) == [2, 2], listing
    assert len(set.union(*digests.values())) == 3
    for _ in range(2):
        warm = _run(run_py, cache)
        assert warm["ok"], warm
        assert warm["num_inductor_compiles"] == 0 and warm["num_corrupt_artifacts"] == 0, warm
        assert warm["num_cache_hits"] == 4
        for a, b in zip(warm["outs"], cold["outs"], strict=True):
            assert torch.equal(torch.tensor(a), torch.tensor(b))
