"""Compile two small functions split at ``torch.mm`` under model tags, in one
fresh process (tests/test_artifact_binding.py): ``f`` (sin * 2) and ``g``
(cos * 3) have pieces of the same shapes and different code.

    python -m programs.mm_tags CACHE RUNS_JSON

``RUNS_JSON`` is a list of ``[function, model_tag]`` compiled and run in
turn. Reports, per tag, the largest difference from eager and the model's
cache folder; the counters the whole run changed; the fxpiece log messages.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch

import fxpiece
from programs.report import keep_logs, report

torch.manual_seed(0)
W = torch.randn(8, 8)


def f(x: torch.Tensor) -> torch.Tensor:
    return torch.mm(torch.sin(x) * 2, W) + 1


def g(x: torch.Tensor) -> torch.Tensor:
    return torch.mm(torch.cos(x) * 3, W) - 1


FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"f": f, "g": g}


def main(cache: str, runs: list[tuple[str, str]]) -> dict[str, Any]:
    logs = keep_logs()
    x = torch.randn(5, 8)
    out: dict[str, dict[str, Any]] = {}
    before = fxpiece.counters.snapshot()
    for name, tag in runs:
        cfg = fxpiece.CompileConfig(
            splitting_ops=[torch.mm], max_num_tokens=16, cache_dir=cache, model_tag=tag
        )
        cm = fxpiece.compile(FUNCTIONS[name], cfg)
        got = cm(x)
        out[tag] = {
            "diff": (got - FUNCTIONS[name](x)).abs().max().item(),
            "folder": str(cm.stats.graphs[0].cache_folder),
        }
    after = fxpiece.counters.snapshot()
    return {"out": out, "counters": {k: after[k] - before[k] for k in after}, "logs": logs}


if __name__ == "__main__":
    report(main(sys.argv[1], [(n, t) for n, t in json.loads(sys.argv[2])]))
