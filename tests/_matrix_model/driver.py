"""Subprocess driver of the mutation matrix and the corruption sweep.

``python driver.py SPEC.json`` runs every run of the spec in order in this
one process and prints one ``FXPIECE-TEST-RESULT:`` line with a JSON list of
results. A run (a dict) says:

- ``pkg``: the folder holding the model's files (put first on ``sys.path``);
- ``config``: :class:`fxpiece.CompileConfig` keyword arguments (JSON);
- ``pass_tag``: add ``mm_pass.MarkPass(pass_tag)`` as a post-grad pass;
- ``hidden``, ``dtype``, ``seed``: the model's width, dtype and weight seed;
- ``scale``: set ``mm_model.SCALE`` (a Python constant Dynamo bakes in);
- ``threads``: ``torch.set_num_threads`` before compiling;
- ``inductor_global``: ``torch._inductor.config`` options set before compiling;
- ``sizes``: token counts to run; ``out``: ``torch.save`` the outputs there;
- ``uncached``: also compile the same setup with ``disable_cache=True`` and
  compare the outputs (bitwise, and the largest difference);
- ``expect_out``: a file of outputs the cached run must equal bitwise.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

RESULT_MARK = "FXPIECE-TEST-RESULT:"


def _set_inductor(options: dict[str, Any]) -> None:
    import torch._inductor.config as cfg

    for name, value in options.items():
        obj: Any = cfg
        *parents, last = name.split(".")
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, last, value)


def _inputs(n: int, hidden: int, dtype: Any) -> Any:
    import torch

    gen = torch.Generator().manual_seed(1000 + n)
    return torch.randn(n, hidden, generator=gen).to(dtype)


def _compile_and_run(run: dict[str, Any], model: Any, disable: bool) -> tuple[Any, dict[str, Any]]:
    import torch

    import fxpiece

    torch._dynamo.reset()
    kw = dict(run["config"])
    if run.get("pass_tag"):
        kw["post_grad_passes"] = [importlib.import_module("mm_pass").MarkPass(run["pass_tag"])]
    if disable:
        kw["disable_cache"] = True
    cm = fxpiece.compile(model, fxpiece.CompileConfig(**kw))
    dtype = getattr(torch, run.get("dtype", "float32"))
    before = fxpiece.counters.snapshot()
    outs = {}
    with torch.no_grad():
        for n in run["sizes"]:
            outs[n] = cm(_inputs(n, run.get("hidden", 32), dtype))
    after = fxpiece.counters.snapshot()
    diff = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    # The graph that served the calls: the last one whose pieces ran (a warm
    # start loads every ahead-of-time entry of the launch key, and only one
    # of them may serve these inputs), after any AOT fallback.
    ran = [g for g in cm.stats.graphs if any(r.chosen for r in g.runners)]
    g = ran[-1] if ran else cm.stats.graphs[-1]
    info = {
        "diff": diff,
        "key": g.cache_key,
        "folder": str(g.cache_folder) if g.cache_folder else None,
        "graphs": len(cm.stats.graphs),
        "miss_explanation": g.miss_explanation,
        "cache_problem": g.cache_problem,
    }
    return outs, info


def _compare(a: dict[Any, Any], b: dict[Any, Any]) -> dict[str, Any]:
    import torch

    equal = all(torch.equal(a[n], b[n]) for n in a)
    diff = max(float((a[n].float() - b[n].float()).abs().max()) for n in a)
    nan = any(bool(torch.isnan(a[n]).any()) for n in a)
    return {"equal": equal, "max_diff": diff, "nan": nan}


def do_run(run: dict[str, Any]) -> dict[str, Any]:
    import torch

    if run.get("threads"):
        torch.set_num_threads(int(run["threads"]))
    if run.get("inductor_global"):
        _set_inductor(run["inductor_global"])
    mm_model = importlib.import_module("mm_model")
    if run.get("scale") is not None:
        mm_model.SCALE = float(run["scale"])
    model = mm_model.Tiny(hidden=run.get("hidden", 32), seed=run.get("seed", 0)).eval()
    model = model.to(getattr(torch, run.get("dtype", "float32")))
    outs, info = _compile_and_run(run, model, disable=False)
    info["label"] = run.get("label", "")
    info["nan"] = any(bool(torch.isnan(o).any()) for o in outs.values())
    if run.get("out"):
        torch.save(outs, run["out"])
    if run.get("expect_out"):
        info["vs_expected"] = _compare(outs, torch.load(run["expect_out"]))
    if run.get("uncached"):
        ref, ref_info = _compile_and_run(run, model, disable=True)
        info["vs_uncached"] = _compare(outs, ref)
        info["uncached_compiles"] = ref_info["diff"].get("num_inductor_compiles", 0)
    return info


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    sys.path.insert(0, spec["pkg"])
    results = [do_run(run) for run in spec["runs"]]
    print(RESULT_MARK + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
