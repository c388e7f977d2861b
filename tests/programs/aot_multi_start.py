"""One start of a user's project model that needs several Dynamo graphs (a
prefill and decode steps on a growing cache: ``multi_model.M`` in
``SPEC["dir"]``), compiled as ``model.forward = fxpiece.compile(model.forward)``
(tests/test_aot_multi.py).

    python -m programs.aot_multi_start SPEC_JSON

``SPEC_JSON``: ``dir`` (the project, put on ``sys.path``), ``root`` (cache
dir), ``out`` (outputs saved there). Reports the start's path and reason,
the non-zero counters, Dynamo's traced frames, whether the outputs match
eager, whether the caller's cache tensors were left unmarked, the token
sizes chosen and the log messages.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import torch

import fxpiece
from fxpiece.toy_llama import ATTENTION_OP
from programs.report import keep_logs, report


def main(spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, spec["dir"])
    multi_model = importlib.import_module("multi_model")
    logs = keep_logs()
    cfg = fxpiece.CompileConfig(
        cache_dir=spec["root"],
        splitting_ops=[ATTENTION_OP],
        max_num_tokens=16,
        compile_sizes=[1],
    )
    m = multi_model.M().eval()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    steps = [x[:5], x[5:6], x[6:7], x[7:8]]  # a prefill, then decode steps on a longer cache
    with torch.no_grad():
        ref_cache = multi_model.Cache()
        refs = [m(s, ref_cache)["out"] for s in steps]
    cm = fxpiece.compile(m.forward, cfg, dynamic_arg_dims={0: 0}, varying_dims={1: 0})
    m.forward = cm
    cache = multi_model.Cache()
    outs, held_marked = [], []
    with torch.no_grad():
        for s in steps:
            held = cache.k
            outs.append(m(s, cache)["out"])
            if held is not None:  # the caller's cache tensor is left unmarked
                held_marked.append(hasattr(held, "_dynamo_dynamic_indices"))
    torch.save(outs, spec["out"])
    c = cm.stats.counters.snapshot()
    start = cm.start
    assert start is not None
    return {
        "path": start.path,
        "why": start.why_not_aot,
        "counters": {k: v for k, v in c.items() if v},
        "dynamo_frames": int(torch._dynamo.utils.counters["frames"]["ok"]),
        "close": all(
            torch.allclose(o, r, atol=1e-5, rtol=1e-4) for o, r in zip(outs, refs, strict=True)
        ),
        "held_marked": held_marked,
        "token_sizes": sorted({s for g in cm.stats.graphs for r in g.runners for s in r.chosen}),
        "logs": logs,
    }


if __name__ == "__main__":
    report(main(json.loads(sys.argv[1])))
