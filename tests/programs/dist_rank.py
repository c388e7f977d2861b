"""One rank of a ``DistributedBackend`` job with a private cache each (no
shared file system; tests/test_distributed.py). torch.distributed's
environment (``MASTER_ADDR``, ``RANK``, ...) comes from the test.

    python -m programs.dist_rank CACHES COMPILER

Prints (the last stdout line) the counters as JSON with ``ok`` (equals
eager), ``rank``, ``shared_in``/``kernels_in`` (what the rank received from
others) and ``model_bundle`` (a model-level kernel bundle was indexed).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

import fxpiece
from fxpiece.cache.entries import MODEL_KERNELS, EntryIndex
from fxpiece.cache.index import CacheIndex
from fxpiece.distributed import DistributedBackend
from fxpiece.toy_llama import ToyLlama, ToyLlamaConfig


def main(caches: str, compiler: str) -> dict[str, Any]:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cache = os.path.join(caches, f"rank{rank}")  # private: no shared file system
    m = ToyLlama(ToyLlamaConfig(num_layers=1)).eval()
    cfg = fxpiece.CompileConfig(
        splitting_ops=["fxpiece_toy::attention"],
        compile_ranges_endpoints=[8],
        max_num_tokens=64,
        compiler=compiler,
        cache_dir=cache,
    )
    backend = DistributedBackend(cfg)
    cm = fxpiece.compile(m, backend=backend)
    ids = torch.arange(5)
    with torch.no_grad():
        ok = torch.allclose(cm(ids), m(ids), atol=1e-4)
    c: dict[str, Any] = dict(fxpiece.counters.snapshot())
    folder = cm.stats.graphs[0].cache_folder
    assert folder is not None
    c.update(
        ok=bool(ok),
        shared_in=backend.shared_in,
        rank=rank,
        kernels_in=backend.kernels_in,
        model_bundle=EntryIndex(CacheIndex(str(folder / "index"), readonly=True)).get(MODEL_KERNELS)
        is not None,
    )
    dist.destroy_process_group()
    return c


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])), flush=True)
