"""Ahead-of-time warm start: a fresh process loads Dynamo's saved output and
traces nothing; anything that could make it stale makes it miss."""

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

SCALE = 2.0


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
        BREAK
        return self.b(h) * SCALE
"""


def _project(tmp: Path, graph_break: bool = False) -> Path:
    d = tmp / "proj"
    d.mkdir(parents=True)
    brk = "torch._dynamo.graph_break()" if graph_break else "pass"
    (d / "aot_model.py").write_text(MODEL.replace("BREAK", brk))
    return d


def _run(run_py: PyRunner, proj: Path, root: Path, out: Path, **extra: Any) -> dict[str, Any]:
    spec = {"dir": str(proj), "root": str(root), "out": str(out), **extra}
    result: dict[str, Any] = run_py.program("aot_start", json.dumps(spec))
    assert result["close"], result
    return result


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory, run_py: PyRunner) -> tuple[Path, Path, dict]:
    """One cold start (captured and saved), shared: each test copies it."""
    tmp = tmp_path_factory.mktemp("aot-cold")
    proj = _project(tmp)
    root = tmp / "cache"
    r = _run(run_py, proj, root, tmp / "cold.pt")
    assert r["path"] == "aot-capture", r
    assert r["counters"]["num_aot_saves"] == 1
    assert r["counters"]["num_inductor_compiles"] == 2  # two pieces, one range
    assert r["probe"]["complete"] == [True, True], r["probe"]
    return tmp, root, r


def _copy(cold: tuple[Path, Path, dict], tmp: Path) -> tuple[Path, Path]:
    src, root, _ = cold
    shutil.copytree(src / "proj", tmp / "proj")
    shutil.copytree(root, tmp / "cache")
    return tmp / "proj", tmp / "cache"


@pytest.mark.slow
def test_warm_start_loads_dynamo_output_and_compiles_nothing(
    cold: tuple[Path, Path, dict], run_py: PyRunner, tmp_path: Path
) -> None:
    import torch

    proj, root = _copy(cold, tmp_path)
    r = _run(run_py, proj, root, tmp_path / "warm.pt")
    assert r["path"] == "aot-load", r
    c = r["counters"]
    assert c["num_aot_loads"] == 1 and "num_aot_fallbacks" not in c, c
    assert "num_inductor_compiles" not in c and c["num_cache_hits"] == 2, c
    # The light graph keeps the values the pieces' planning reads: no fake run.
    assert r["probe"]["fake_runs"] == 0, r["probe"]
    for a, b in zip(torch.load(cold[0] / "cold.pt"), torch.load(tmp_path / "warm.pt"), strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_a_piece_compiled_on_a_warm_start_gets_the_whole_graph(
    cold: tuple[Path, Path, dict], run_py: PyRunner, tmp_path: Path
) -> None:
    """A warm start loads the light graph; a piece it must compile (its
    entry is gone) is compiled from the whole graph, as on a cold start."""
    import torch

    from fxpiece.cache.entries import EntryIndex, PieceKey
    from fxpiece.cache.index import CacheIndex

    proj, root = _copy(cold, tmp_path)
    (index_path,) = (p for p in root.glob("models/*/*/index") if ".aot" not in p.parent.name)
    index = EntryIndex(CacheIndex(str(index_path)))
    pieces = [k for k, _ in index.items() if isinstance(k, PieceKey)]
    assert len(pieces) == 2, pieces
    # Gone from the index and from the store (else it is found by digest).
    entry = index.get(pieces[-1])
    assert entry is not None
    (root / entry.handle["artifact"]).unlink()
    assert index.remove(pieces[-1])
    r = _run(run_py, proj, root, tmp_path / "warm.pt")
    assert r["path"] == "aot-load", r
    c = r["counters"]
    assert c.get("num_inductor_compiles") == 1 and c["num_cache_hits"] == 1, r
    assert r["probe"]["complete"] == [True], r["probe"]
    for a, b in zip(torch.load(cold[0] / "cold.pt"), torch.load(tmp_path / "warm.pt"), strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    ["source", "config", "inductor"],
)
def test_anything_that_changes_the_code_misses(
    cold: tuple[Path, Path, dict], run_py: PyRunner, tmp_path: Path, change: str
) -> None:
    proj, root = _copy(cold, tmp_path)
    extra: dict[str, Any] = {}
    if change == "source":
        src = proj / "aot_model.py"
        src.write_text(src.read_text().replace("SCALE = 2.0", "SCALE = 3.0"))
    elif change == "config":
        extra["config"] = {"compile_sizes": [4]}
    else:
        extra["inductor"] = {"epilogue_fusion": False}
    r = _run(run_py, proj, root, tmp_path / "out.pt", **extra)
    c = r["counters"]
    assert "num_aot_loads" not in c, r
    # A miss captures again (the model traces as one graph) and recompiles
    # what the change touched; the outputs match eager with the change
    # (``close``: the edited SCALE is what runs).
    assert r["path"] == "aot-capture", r
    if change == "source":
        assert "aot_model" in r["why"], r
    else:
        assert c.get("num_inductor_compiles", 0) >= 1, c


@pytest.mark.slow
def test_graph_break_falls_back_with_the_reason_logged(run_py: PyRunner, tmp_path: Path) -> None:
    proj = _project(tmp_path, graph_break=True)
    root = tmp_path / "cache"
    r = _run(run_py, proj, root, tmp_path / "a.pt", config={"compiler": "eager"})
    assert r["path"] == "dynamo" and "graph break" in r["why"], r
    assert r["counters"]["num_aot_fallbacks"] == 1
    assert any(
        "ahead-of-time warm start unavailable" in m and "graph break" in m for m in r["logs"]
    )
    # The next start does not try again: it says the reason was recorded.
    r2 = _run(run_py, proj, root, tmp_path / "b.pt", config={"compiler": "eager"})
    assert r2["path"] == "dynamo" and "num_aot_fallbacks" not in r2["counters"], r2
    assert any("recorded by an earlier start" in m for m in r2["logs"]), r2["logs"]


@pytest.mark.slow
def test_corrupt_entry_is_quarantined_and_the_start_recovers(
    cold: tuple[Path, Path, dict], run_py: PyRunner, tmp_path: Path
) -> None:
    from fxpiece.cache.entries import AotKey, EntryIndex
    from fxpiece.cache.index import CacheIndex

    proj, root = _copy(cold, tmp_path)
    (index,) = root.glob("models/*/*.aot/index")
    entry = EntryIndex(CacheIndex(str(index))).get(AotKey(0))
    assert entry is not None
    rel = entry.handle["artifact"]
    art = root / rel
    data = bytearray(art.read_bytes())
    data[len(data) // 2] ^= 0xFF
    art.write_bytes(bytes(data))
    r = _run(run_py, proj, root, tmp_path / "a.pt")
    assert r["path"] == "aot-capture", r  # captured and saved again
    assert (
        r["counters"]["num_corrupt_artifacts"] == 1 and "num_inductor_compiles" not in r["counters"]
    )
    assert list(art.parent.glob(art.name + ".corrupt-*")), "the corrupt entry was moved aside"
    r2 = _run(run_py, proj, root, tmp_path / "b.pt")
    assert r2["path"] == "aot-load", r2
