"""Ahead-of-time warm start of a model whose calls need several Dynamo
graphs (a prefill and a decode step with a growing cache, as in
``generate``): every graph is captured on the cold start, a fresh process
loads them all and Dynamo traces nothing.

The model has what made Hugging Face models uncapturable, each checked to
fail this test when its fix is taken out: it is compiled as
``model.forward = fxpiece.compile(model.forward)`` (a bound method, and a
``CompiledModel`` the guards reach), it holds a module of a class defined in
a local scope whose ``forward`` is a decorator's closure (guards through
``type(m)``), and it returns an ``OrderedDict`` built in another module
(Dynamo's bytecode reads ``collections`` through a per-process global)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PyRunner

import fxpiece
from fxpiece.api import UnpickledCompiledModel
from fxpiece.errors import NotRunnableError

PACK = """
import collections


def pack(x):
    return collections.OrderedDict(out=x)
"""

MODEL = """
import functools

import torch
from fxpiece.toy_llama import attention
from multi_pack import pack  # returns an OrderedDict: Dynamo's bytecode rebuilds it


def _local_module():
    factor = 2.0

    def wrap(fn):  # a decorator with a closure: Dynamo guards type(m).forward's cells
        @functools.wraps(fn)
        def forward(self, x):
            return fn(self, x) * factor

        return forward

    class Scale(torch.nn.Module):  # a local class, as the `kernels` package makes
        @wrap
        def forward(self, x):
            return x

    return Scale()


class Cache:
    \"\"\"A KV-cache-like object: the tensor it holds grows by a token a step.\"\"\"

    def __init__(self):
        self.k = None


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Linear(32, 96)
        self.b = torch.nn.Linear(32, 32)
        self.scale = _local_module()
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)

    def forward(self, x, cache):
        q, k, v = self.a(x).view(-1, 3, 2, 16).unbind(1)
        h = attention(q.contiguous(), k.contiguous(), v.contiguous()).reshape(-1, 32)
        if cache.k is None:
            cache.k = h
        else:
            DECODE_BREAK
            h = h + cache.k.mean(0)
            cache.k = torch.cat([cache.k, h])
        return pack(self.scale(self.b(h)))
"""


def _project(tmp: Path, decode_break: bool = False) -> Path:
    proj = tmp / "proj"
    proj.mkdir()
    brk = "torch._dynamo.graph_break()" if decode_break else "pass"
    (proj / "multi_model.py").write_text(MODEL.replace("DECODE_BREAK", brk))
    (proj / "multi_pack.py").write_text(PACK)
    return proj


def _run(run_py: PyRunner, proj: Path, root: Path, out: Path) -> dict[str, Any]:
    spec = {"dir": str(proj), "root": str(root), "out": str(out)}
    result: dict[str, Any] = run_py.program("aot_multi_start", json.dumps(spec))
    assert result["close"], result
    return result


@pytest.mark.slow
def test_every_graph_is_captured_and_a_warm_start_traces_none(
    run_py: PyRunner, tmp_path: Path
) -> None:
    proj, root = _project(tmp_path), tmp_path / "cache"

    cold = _run(run_py, proj, root, tmp_path / "cold.pt")
    # The prefill and the decode step are two graphs, each captured once: the
    # cache's length is marked dynamic (varying_dims), so a longer cache is
    # served by the same entry, and nothing falls back to Dynamo.
    assert cold["path"] == "aot-capture", cold
    assert cold["counters"]["num_aot_saves"] == 2, cold
    assert "num_aot_fallbacks" not in cold["counters"], cold
    # Pieces dispatch on the token count (5, then 1), never on the cache length.
    assert cold["token_sizes"] == [1, 5], cold
    assert cold["held_marked"] == [False, False, False], cold

    warm = _run(run_py, proj, root, tmp_path / "warm.pt")
    assert warm["path"] == "aot-load", warm
    assert warm["counters"]["num_aot_loads"] == 2, warm
    assert warm["dynamo_frames"] == 0, warm  # Dynamo traced nothing
    assert "num_inductor_compiles" not in warm["counters"], warm
    assert "num_aot_fallbacks" not in warm["counters"], warm
    assert warm["token_sizes"] == [1, 5], warm
    cold_outs, warm_outs = torch.load(tmp_path / "cold.pt"), torch.load(tmp_path / "warm.pt")
    for a, b in zip(cold_outs, warm_outs, strict=True):
        assert torch.equal(a, b)
    # `fxpiece cache ls` names the launch folder's entries by captured graph.
    ls = subprocess.run(
        [sys.executable, "-m", "fxpiece", "cache", "ls", str(root)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    [row] = [line for line in ls.splitlines() if ".aot" in line]
    assert "#0 #1" in row and "aot" in row, ls


@pytest.mark.slow
def test_a_later_call_that_cannot_be_captured_is_traced_and_recorded(
    run_py: PyRunner, tmp_path: Path
) -> None:
    proj, root = _project(tmp_path, decode_break=True), tmp_path / "cache"
    cold = _run(run_py, proj, root, tmp_path / "cold.pt")
    # The prefill is captured; the decode step breaks the graph, so it cannot
    # be: one warning, recorded, and the three decode calls go through Dynamo.
    assert cold["path"] == "aot-capture" and cold["counters"]["num_aot_saves"] == 1, cold
    assert cold["counters"]["num_aot_fallbacks"] == 3, cold
    said = [m for m in cold["logs"] if "later call" in m]
    assert len(said) == 1 and "graph break" in said[0], cold["logs"]

    warm = _run(run_py, proj, root, tmp_path / "warm.pt")
    # The prefill's entry loads; the record stops a second capture attempt.
    assert warm["path"] == "aot-load" and warm["counters"]["num_aot_loads"] == 1, warm
    assert "num_aot_saves" not in warm["counters"], warm
    assert warm["counters"]["num_aot_fallbacks"] == 3, warm
    assert not [m for m in warm["logs"] if "later call" in m], warm["logs"]
    # What compiles again is only what Inductor could not save (said per piece).
    unsaved = [m for m in warm["logs"] if "cannot be saved" in m]
    assert warm["counters"].get("num_inductor_compiles", 0) == len(unsaved), warm


def test_a_pickled_compiled_model_loads_as_a_stub_that_refuses_to_run() -> None:
    cm = fxpiece.compile(
        torch.nn.Linear(4, 4), fxpiece.CompileConfig(compiler="eager", disable_cache=True)
    )
    restored = pickle.loads(pickle.dumps(cm))
    assert isinstance(restored, UnpickledCompiledModel)
    assert "Linear" in restored.what
    with pytest.raises(NotRunnableError, match=r"call fxpiece\.compile on the model again"):
        restored(torch.ones(1, 4))
