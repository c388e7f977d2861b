"""Compile the 1-layer toy model once per config, in one fresh process
(tests/test_cli.py builds its cache with this).

    python -m programs.toy_configs SPEC_JSON

``SPEC_JSON``: ``configs`` (CompileConfig kwargs, each compiled in turn with
Dynamo reset first) and ``sizes`` (token counts run). Reports, per config,
the model key and folder, the largest difference from eager and the
counters its runs changed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

import fxpiece
from programs.report import counter_diff, report
from programs.toy import make_toy, token_ids


def main(spec: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for cfg in spec["configs"]:
        torch._dynamo.reset()
        model = make_toy(1)
        cm = fxpiece.compile(model, fxpiece.CompileConfig(**cfg))
        before = fxpiece.counters.snapshot()
        err = 0.0
        with torch.no_grad():
            for n in spec["sizes"]:
                err = max(err, (cm(token_ids(n)) - model(token_ids(n))).abs().max().item())
        g = cm.stats.graphs[0]
        out.append(
            {
                "key": g.cache_key,
                "folder": str(g.cache_folder),
                "err": err,
                "diff": counter_diff(before, fxpiece.counters.snapshot()),
            }
        )
    return out


if __name__ == "__main__":
    report(main(json.loads(sys.argv[1])))
