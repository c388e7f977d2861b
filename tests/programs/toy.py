"""The toy Llama helpers the tests and their subprocess programs share
(importing this module imports torch)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import fxpiece
from fxpiece.toy_llama import ToyLlama, ToyLlamaConfig
from programs.report import counter_diff


def token_ids(n: int, vocab: int = 512) -> torch.Tensor:
    """Deterministic token ids ``[n]``."""
    return (torch.arange(n, dtype=torch.long) * 37 + 11) % vocab


def make_toy(layers: int, dtype: str = "float32", sdpa: bool = False) -> ToyLlama:
    """The toy Llama (hidden 64), seeded, in eval mode and ``dtype``."""
    model = ToyLlama(ToyLlamaConfig(num_layers=layers, sdpa=sdpa)).eval()
    return model.to(getattr(torch, dtype))


class RecordRange(fxpiece.InductorPass):
    """A post-grad pass that changes nothing and records the compile range
    Inductor runs it for. ``tag`` is its option (enters its uuid)."""

    def __init__(self, tag: str = "rec") -> None:
        self.tag = tag
        self.seen: list[fxpiece.Range | None] = []

    def options(self) -> Any:
        return {"tag": self.tag}

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.seen.append(fxpiece.current_compile_range())


def run_toy(spec: Mapping[str, Any], keep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compile the toy model with ``fxpiece.compile`` and run it for each
    size; used in-process and (``python -m programs.run_toy SPEC``) in subprocesses.

    ``spec``: ``layers``, ``dtype``, ``sdpa``, ``config`` (CompileConfig
    kwargs), ``pass_tag`` (add a :class:`RecordRange`), ``sizes``, ``out`` (a
    file to ``torch.save`` the outputs to). ``keep`` receives the compiled
    model (``cm``), the pass (``rec``) and the outputs (``outs``)."""
    kw = dict(spec["config"])
    rec = None
    if spec.get("pass_tag"):
        rec = RecordRange(spec["pass_tag"])
        kw["post_grad_passes"] = [rec]
    cfg = fxpiece.CompileConfig(**kw)
    model = make_toy(spec["layers"], spec.get("dtype", "float32"), spec.get("sdpa", False))
    cm = fxpiece.compile(model, cfg)
    before = fxpiece.counters.snapshot()
    outs = {}
    diff_first: dict[str, int] = {}
    with torch.no_grad():
        for n in spec["sizes"]:
            outs[n] = cm(token_ids(n))
            if not diff_first:
                diff_first = counter_diff(before, fxpiece.counters.snapshot())
    diff = counter_diff(before, fxpiece.counters.snapshot())
    if keep is not None:
        keep.update(cm=cm, rec=rec, outs=outs, model=model)
    if spec.get("out"):
        torch.save(outs, spec["out"])
    g = cm.stats.graphs[0]
    return {
        "diff": diff,
        "diff_first": diff_first,
        "key": g.cache_key,
        "folder": str(g.cache_folder) if g.cache_folder else None,
        "compiled": [p.compiled for p in g.pieces],
        "loaded": [p.loaded for p in g.pieces],
        "reused": [p.reused for p in g.pieces],
        "pass_seen": [str(r) for r in rec.seen] if rec else [],
        "num_graphs": len(cm.stats.graphs),
    }
