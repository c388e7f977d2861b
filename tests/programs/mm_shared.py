"""Two functions split at ``torch.mm`` whose first pieces are the same code
(sin * 2), compiled into one cache in a fresh process
(tests/test_multigraph.py).

    python -m programs.mm_shared CACHE

Reports whether both match eager, their outputs, their model keys and the
counters the run changed.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import fxpiece
from programs.report import report

torch.manual_seed(0)
W = torch.randn(8, 8)


def f(x: torch.Tensor) -> torch.Tensor:
    return torch.mm(torch.sin(x) * 2, W) + 1


def g(x: torch.Tensor) -> torch.Tensor:
    return torch.mm(torch.sin(x) * 2, W) - 1


def main(cache: str) -> dict[str, Any]:
    cfg = fxpiece.CompileConfig(splitting_ops=[torch.mm], max_num_tokens=16, cache_dir=cache)
    before = fxpiece.counters.snapshot()
    x = torch.randn(5, 8)
    cf, cg = fxpiece.compile(f, cfg), fxpiece.compile(g, cfg)
    outs = [cf(x), cg(x)]
    after = fxpiece.counters.snapshot()
    ok = all(
        torch.allclose(o, r, rtol=1e-5, atol=1e-5) for o, r in zip(outs, [f(x), g(x)], strict=True)
    )
    return {
        "ok": ok,
        "outs": [o.tolist() for o in outs],
        "keys": [c.stats.graphs[0].cache_key for c in (cf, cg)],
        **{k: after[k] - before[k] for k in after},
    }


if __name__ == "__main__":
    report(main(sys.argv[1]))
