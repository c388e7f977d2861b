"""One start of the 1-layer toy model with the eager compiler (the
ahead-of-time start on), in a fresh process (tests/test_check_before_create.py,
tests/test_index_schema_compat.py).

    python -m programs.toy_eager_start SPEC_JSON

``SPEC_JSON``: ``root`` (cache dir), optionally ``compiler`` (default
``eager``). Reports the start's path and reason, its non-zero counters, the
output, whether a module named ``evilpkg`` was imported, and the log messages.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

import fxpiece
from fxpiece.toy_llama import ATTENTION_OP
from programs.report import keep_logs, report
from programs.toy import make_toy, token_ids


def main(spec: dict[str, Any]) -> dict[str, Any]:
    logs = keep_logs()
    cfg = fxpiece.CompileConfig(
        compiler=spec.get("compiler", "eager"),
        cache_dir=spec["root"],
        splitting_ops=[ATTENTION_OP],
        max_num_tokens=32,
    )
    cm = fxpiece.compile(make_toy(1), cfg)
    with torch.no_grad():
        out = cm(token_ids(5))
    counters = cm.stats.counters.snapshot()
    start = cm.start
    assert start is not None
    return {
        "path": start.path,
        "why": start.why_not_aot,
        "counters": {k: v for k, v in counters.items() if v},
        "out": out.flatten().tolist(),
        "evil_imported": "evilpkg" in sys.modules,
        "logs": logs,
    }


if __name__ == "__main__":
    report(main(json.loads(sys.argv[1])))
