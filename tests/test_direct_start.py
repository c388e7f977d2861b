"""A warm start that compiles nothing does nothing a compile needs (issue
25): every piece's wrapper and kernels come from its verified artifact and
kernel bundle (the *direct form*,
:mod:`fxpiece.piecewise._torch_compat.direct`), and Inductor's compiler,
code caches and AOTAutograd's cache are never imported. Where the direct
form cannot run (a kernel missing), the piece loads the usual way and the
outputs are the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import PyRunner

MODEL = """
import torch
from fxpiece.toy_llama import attention


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Linear(32, 96)
        self.b = torch.nn.Linear(32, 32)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)

    def forward(self, x):
        q, k, v = self.a(x).view(-1, 3, 2, 16).unbind(1)
        h = attention(q.contiguous(), k.contiguous(), v.contiguous())
        return torch.nn.functional.silu(self.b(h)) * 2.0
"""


def _run(run_py: PyRunner, proj: Path, root: Path, out: Path) -> dict[str, Any]:
    spec = {"dir": str(proj), "root": str(root), "out": str(out)}
    result: dict[str, Any] = run_py.program("aot_start", json.dumps(spec))
    assert result["close"], result
    return result


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory, run_py: PyRunner) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("direct-cold")
    (tmp / "proj").mkdir()
    (tmp / "proj" / "aot_model.py").write_text(MODEL)
    r = _run(run_py, tmp / "proj", tmp / "cache", tmp / "cold.pt")
    assert r["path"] == "aot-capture", r
    assert r["counters"]["num_inductor_compiles"] == 2, r
    return tmp, r


def _copy(cold: tuple[Path, dict[str, Any]], tmp: Path) -> tuple[Path, Path]:
    src, _ = cold
    shutil.copytree(src / "proj", tmp / "proj")
    shutil.copytree(src / "cache", tmp / "cache")
    return tmp / "proj", tmp / "cache"


def _same_outputs(a: Path, b: Path) -> None:
    import torch

    for x, y in zip(torch.load(a), torch.load(b), strict=True):
        assert torch.equal(x, y)


@pytest.mark.slow
def test_a_warm_start_that_loads_every_piece_never_imports_inductors_compiler(
    cold: tuple[Path, dict[str, Any]], run_py: PyRunner, tmp_path: Path
) -> None:
    # The cold start compiled, so it imported them (the probe is not blind).
    assert "torch._inductor.compile_fx" in cold[1]["imported"], cold[1]
    proj, root = _copy(cold, tmp_path)
    r = _run(run_py, proj, root, tmp_path / "warm.pt")
    assert r["path"] == "aot-load", r
    c = r["counters"]
    assert "num_inductor_compiles" not in c and c["num_cache_hits"] == 2, c
    assert r["imported"] == [], r["imported"]
    assert not [m for m in r["logs"] if "loads the usual way" in m], r["logs"]
    _same_outputs(cold[0] / "cold.pt", tmp_path / "warm.pt")


@pytest.mark.slow
def test_a_piece_whose_kernels_are_gone_loads_the_usual_way(
    cold: tuple[Path, dict[str, Any]], run_py: PyRunner, tmp_path: Path
) -> None:
    """Without its kernel bundles a piece's direct form cannot run: it is
    loaded through Inductor's caches (which rebuild the kernels from their
    source), with the same outputs and nothing compiled by the backend."""
    from fxpiece.cache.entries import EntryIndex, KernelsKey
    from fxpiece.cache.index import CacheIndex

    proj, root = _copy(cold, tmp_path)
    (index_path,) = (p for p in root.glob("models/*/*/index") if ".aot" not in p.parent.name)
    index = EntryIndex(CacheIndex(str(index_path)))
    bundles = [k for k, _ in index.items() if isinstance(k, KernelsKey)]
    assert bundles
    for k in bundles:
        entry = index.get(k)
        assert entry is not None and entry.artifact is not None
        (root / entry.artifact).unlink()
        assert index.remove(k)
    r = _run(run_py, proj, root, tmp_path / "warm.pt")
    assert r["path"] == "aot-load", r
    c = r["counters"]
    assert "num_inductor_compiles" not in c and c["num_cache_hits"] == 2, c
    assert "torch._inductor.compile_fx" in r["imported"], r["imported"]
    assert [m for m in r["logs"] if "loads the usual way" in m], r["logs"]
    _same_outputs(cold[0] / "cold.pt", tmp_path / "warm.pt")
