"""One start of a user's project model (``aot_model.M`` in ``SPEC["dir"]``)
with the ahead-of-time warm start on (tests/test_aot.py).

    python -m programs.aot_start SPEC_JSON

``SPEC_JSON``: ``dir`` (the project, put on ``sys.path``), ``root`` (cache
dir), ``out`` (outputs saved there), ``config`` (more CompileConfig kwargs),
``inductor`` (Inductor config set first). Probes: how often the split module
is fake-run, and whether each graph handed to Inductor carries every node's
recorded value (the whole graph, not the light one a warm start loads).
Reports the start's path and reason, the non-zero counters, whether the
outputs match eager, the log messages, the probes, and which of the
modules a compile needs (:data:`COMPILE_MODULES`) the start imported.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import torch

import fxpiece
import fxpiece.piecewise.compilers as compilers
import fxpiece.piecewise.plan as plan
from fxpiece.toy_llama import ATTENTION_OP
from programs.report import keep_logs, report

COMPILE_MODULES = (
    "torch._inductor.compile_fx",
    "torch._inductor.codecache",
    "torch._inductor.select_algorithm",
    "torch._inductor.async_compile",
    "torch._inductor.lowering",
    "torch._functorch._aot_autograd.autograd_cache",
    "fxpiece.piecewise.remote_tier",
    "fxpiece.cache.admin",
)
"""Inductor's compiler, code caches and AOTAutograd's cache: what loading
a piece the usual way imports, and a direct load does not; and fxpiece's
remote tier and cache admin code, which a start without a remote cache
never needs."""


def install_probes() -> dict[str, Any]:
    probe: dict[str, Any] = {"fake_runs": 0, "complete": []}
    propagated = plan.propagated_inputs

    def counted(*a: Any, **k: Any) -> Any:
        probe["fake_runs"] += 1
        return propagated(*a, **k)

    plan.propagated_inputs = counted
    compile_ = compilers.InductorStandaloneCompiler.compile

    def recorded(self: Any, graph: Any, *a: Any, **k: Any) -> Any:
        nodes = [n for n in graph.graph.nodes if n.op == "call_function"]
        probe["complete"].append(all("example_value" in n.meta for n in nodes))
        return compile_(self, graph, *a, **k)

    compilers.InductorStandaloneCompiler.compile = recorded  # type: ignore[method-assign]
    return probe


def main(spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, spec["dir"])
    aot_model = importlib.import_module("aot_model")
    logs = keep_logs()
    probe = install_probes()
    for k, v in spec.get("inductor", {}).items():
        setattr(torch._inductor.config, k, v)
    cfg = fxpiece.CompileConfig(
        cache_dir=spec["root"],
        splitting_ops=[ATTENTION_OP],
        max_num_tokens=64,
        **spec.get("config", {}),
    )
    m = aot_model.M().eval()
    cm = fxpiece.compile(m, cfg)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        outs = [cm(x[:n]) for n in (5, 9, 1)]
        refs = [m(x[:n]) for n in (5, 9, 1)]
    torch.save(outs, spec["out"])
    c = cm.stats.counters.snapshot()
    start = cm.start
    assert start is not None
    return {
        "path": start.path,
        "why": start.why_not_aot,
        "counters": {k: v for k, v in c.items() if v},
        "close": all(
            torch.allclose(o, r, atol=1e-5, rtol=1e-4) for o, r in zip(outs, refs, strict=True)
        ),
        "logs": logs,
        "probe": probe,
        "imported": [m for m in COMPILE_MODULES if m in sys.modules],
    }


if __name__ == "__main__":
    report(main(json.loads(sys.argv[1])))
