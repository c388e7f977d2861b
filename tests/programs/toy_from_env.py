"""Compile the toy model with Inductor, its config from the environment plus
arguments, and run it once (tests/test_modes.py: read-only caches and
``require_cache_hit``).

    python -m programs.toy_from_env CACHE LAYERS EXTRA_JSON

``EXTRA_JSON``: more CompileConfig kwargs. Reports ``ok`` (equals eager) and
every counter, or the CacheError raised (``error``, ``msg``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

import fxpiece
from fxpiece.toy_llama import ToyLlama, ToyLlamaConfig
from programs.report import report


def main(cache: str, layers: int, extra: dict[str, Any]) -> dict[str, Any]:
    m = ToyLlama(ToyLlamaConfig(num_layers=layers)).eval()
    cfg = fxpiece.CompileConfig.from_env(
        splitting_ops=["fxpiece_toy::attention"],
        max_num_tokens=64,
        cache_dir=cache,
        compiler="inductor",
        **extra,
    )
    cm = fxpiece.compile(m, cfg)
    try:
        with torch.no_grad():
            ok = torch.allclose(cm(torch.arange(5)), m(torch.arange(5)), atol=1e-4)
        return {"ok": bool(ok), **fxpiece.counters.snapshot()}
    except fxpiece.CacheError as e:
        return {"error": type(e).__name__, "msg": str(e)}


if __name__ == "__main__":
    report(main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])))
