"""Start a job of N ranks on one cache: every identical piece compiles once.

    torchrun --nproc-per-node 4 examples/cluster_startup.py [--cache-dir DIR] [--no-shared-fs]

Each rank compiles a toy Llama (BF16, split at attention) with fxpiece and
prints its timings; rank 0 prints the job's totals. With a shared cache
folder (the default: one folder for all ranks) ranks take per-piece leases so
each piece is compiled by one rank while the others wait and load it. With
``--no-shared-fs`` every rank has a private folder and the ranks share the
compiled artifacts through torch.distributed (gloo) instead.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist

import fxpiece
from fxpiece.distributed import DistributedBackend
from fxpiece.toy_llama import ATTENTION_OP, ToyLlama, ToyLlamaConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "fxpiece-cluster"))
    p.add_argument("--no-shared-fs", action="store_true")
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cache = os.path.join(a.cache_dir, f"rank{rank}") if a.no_shared_fs else a.cache_dir
    torch.manual_seed(0)
    model = ToyLlama(
        ToyLlamaConfig(num_layers=a.layers, hidden_size=256, intermediate_size=512, num_heads=8)
    )
    model = model.eval().to(torch.bfloat16)
    config = fxpiece.CompileConfig(
        splitting_ops=[ATTENTION_OP],
        compile_ranges_endpoints=[16],
        max_num_tokens=256,
        compile_sizes=[8],
        cache_dir=cache,
    )
    backend = DistributedBackend(config) if a.no_shared_fs else fxpiece.Backend(config)
    compiled = fxpiece.compile(model, backend=backend)
    dist.barrier()
    t0 = time.perf_counter()
    ids = torch.arange(24)
    with torch.no_grad():
        out = compiled(ids)
        ok = torch.allclose(out.float(), model(ids).float(), atol=0.05, rtol=0.05)
    first = time.perf_counter() - t0
    c = compiled.stats.counters
    b = compiled.stats.startup
    assert b is not None  # set by the first call
    print(
        f"rank {rank}: first output {first:.2f} s (trace {b.trace_s:.2f}, key {b.key_s:.2f}, "
        f"wait {b.wait_s:.2f}, compile {b.compile_s:.2f}, load {b.load_s:.2f}, first run "
        f"{b.first_run_s:.2f}); Inductor compiles {c.num_inductor_compiles}, hits "
        f"{c.num_cache_hits}, waits {c.num_cache_waits}; compile slots per host "
        f"{compiled.stats.max_parallel_compiles}; matches eager: {ok}",
        flush=True,
    )
    totals = torch.tensor([c.num_inductor_compiles, c.num_cache_hits, int(ok)], dtype=torch.int64)
    dist.all_reduce(totals)
    wall = torch.tensor([first], dtype=torch.float64)
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(
            f"job: {world} ranks, {'private folders + gloo' if a.no_shared_fs else 'shared folder'}"
            f"; total Inductor compiles {int(totals[0])}, hits {int(totals[1])}; every rank's "
            f"first output within {wall.item():.2f} s; ranks matching eager "
            f"{int(totals[2])}/{world}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
