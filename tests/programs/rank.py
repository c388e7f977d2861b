"""One rank of a multi-process start (tests/test_ranks.py): compile the toy
model into a shared cache, run it once, print its counters as JSON.

    python -m programs.rank CACHE COMPILER LAYERS

``COMPILER`` is a registered name or ``slow-eager`` (:class:`SlowEager`).
Environment: ``SLOW_COMPILE`` (seconds each compile sleeps, printing
``compiling`` first), ``ENDPOINTS``, ``LEASE_TTL``, ``LOCK_TIMEOUT``,
``SALT`` (another Inductor option: every digest differs), ``SLOTS``.

Events for the test to wait on, instead of sleeping: ``READY_FILE`` is
created once the model is built and the rank waits for ``GO_FILE``;
``WAIT_MARK`` gets a line with the path of each lease or compile slot this
rank found taken by another process (it is waiting for it from then on).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

import fxpiece
from fxpiece.cache.lease import Lease
from fxpiece.piecewise.compilers import EagerCompiler
from fxpiece.toy_llama import ToyLlama, ToyLlamaConfig


class SlowEager(EagerCompiler):
    """Same name and hash as "eager" (the same digests); sleeps in compile
    when ``SLOW_COMPILE`` is set."""

    def compile(self, graph: Any, example_inputs: Any, entry: Any, ctx: Any) -> Any:
        if os.environ.get("SLOW_COMPILE"):
            print("compiling", flush=True)
            time.sleep(float(os.environ["SLOW_COMPILE"]))
        return super().compile(graph, example_inputs, entry, ctx)


def mark_waits(mark: Path) -> None:
    """Append to ``mark`` the path of every lease or slot found taken: the
    moment this rank starts waiting for another process."""
    try_acquire, try_take = Lease.try_acquire, Lease.try_take

    def note(path: str, lease: Lease | None) -> Lease | None:
        if lease is None:
            with open(mark, "a") as f:
                f.write(path + "\n")
        return lease

    def acquire(path: str, **kw: Any) -> Lease | None:
        return note(path, try_acquire(path, **kw))

    def take(path: str, **kw: Any) -> Lease | None:
        return note(path, try_take(path, **kw))

    Lease.try_acquire = acquire  # type: ignore[method-assign]
    Lease.try_take = take  # type: ignore[method-assign]


def main() -> None:
    cache, compiler, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    env = os.environ
    if env.get("WAIT_MARK"):
        mark_waits(Path(env["WAIT_MARK"]))
    m = ToyLlama(ToyLlamaConfig(num_layers=layers)).eval()
    ends = [int(x) for x in env.get("ENDPOINTS", "").split(",") if x]
    cfg = fxpiece.CompileConfig(
        splitting_ops=["fxpiece_toy::attention"],
        max_num_tokens=64,
        cache_dir=cache,
        compiler=SlowEager() if compiler == "slow-eager" else compiler,
        lease_ttl=float(env.get("LEASE_TTL", "30")),
        lock_timeout=float(env.get("LOCK_TIMEOUT", "600")),
        compile_ranges_endpoints=ends,
        inductor_config={"max_autotune": True} if env.get("SALT") else {},
        max_parallel_compiles=int(env["SLOTS"]) if env.get("SLOTS") else None,
    )
    if env.get("READY_FILE"):
        Path(env["READY_FILE"]).touch()
    if env.get("GO_FILE"):
        while not os.path.exists(env["GO_FILE"]):
            time.sleep(0.01)
    cm = fxpiece.compile(m, cfg)
    ids = torch.arange(5)
    with torch.no_grad():
        out = cm(ids)
        ok = torch.allclose(out, m(ids), atol=1e-4)
    c: dict[str, Any] = dict(fxpiece.counters.snapshot())
    c["ok"] = bool(ok)
    pieces = cm.stats.graphs[0].pieces
    c["wait_s"] = sum(p.wait_s for p in pieces)
    c["slot_wait_s"] = sum(p.slot_wait_s for p in pieces)
    c["intervals"] = [iv for p in pieces for iv in p.compile_intervals]
    startup = cm.stats.startup
    c["startup"] = startup.as_dict() if startup is not None else None
    print(json.dumps(c), flush=True)


if __name__ == "__main__":
    main()
