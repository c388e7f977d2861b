"""Compile and run the 1-layer toy model with Inductor in a fresh process
whose TMPDIR another user prepared (tests/test_inductor_globals.py).

    python -m programs.toy_bisect CACHE

Reports how many pieces the compiled graph has (0: fxpiece was not the
backend), whether the output equals eager, and the fxpiece log messages.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import fxpiece
from fxpiece.toy_llama import ATTENTION_OP
from programs.report import keep_logs, report
from programs.toy import make_toy, token_ids


def main(cache: str) -> dict[str, Any]:
    logs = keep_logs()
    cfg = fxpiece.CompileConfig(splitting_ops=[ATTENTION_OP], cache_dir=cache, max_num_tokens=32)
    cm = fxpiece.compile(make_toy(1), cfg)
    with torch.no_grad():
        y = cm(token_ids(5))
        want = make_toy(1)(token_ids(5))
    return {
        "pieces": len(cm.stats.graphs[0].pieces) if cm.stats.graphs else 0,
        "eager_equal": bool(torch.allclose(y, want, atol=1e-4, rtol=1e-4)),
        "logs": logs,
    }


if __name__ == "__main__":
    report(main(sys.argv[1]))
