"""Steady-state latency of fxpiece, whole-graph Inductor and eager, measured
in ONE process, interleaved.

Measured in separate processes, the ratio moved by 10-40% between runs on
this VM (the machine's speed drifts between the processes). Here the three
run the same toy Llama (same weights) in one process: after untimed warm-up
calls, each round times ``reps / rounds`` calls of each at each size, the
order rotating between rounds, and the median of every call's time is
compared. The caches are ``--cache-dir`` (fxpiece's) and its
``stock-inductor`` folder (Inductor's), as bench_startup.py leaves them.

    python benches/steady_state.py --cache-dir DIR --layers 4 --hidden 256 [--threads 1]

The last line printed is JSON: ``{size: {"eager": s, "inductor": s, "fxpiece": s}}``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def measure(
    cache_dir: str,
    layers: int,
    hidden: int,
    *,
    threads: int | None,
    sizes: list[int],
    reps: int,
    rounds: int,
    max_tokens: int = 256,
) -> dict[str, dict[str, float]]:
    import torch

    if threads:
        torch.set_num_threads(threads)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "stock-inductor")

    import fxpiece
    from fxpiece.demo import demo_config, demo_model
    from fxpiece.piecewise import _torch_compat

    model = demo_model(layers, hidden, "bfloat16")
    ours = fxpiece.compile(model, demo_config(cache_dir, max_tokens))
    stock_compiled = torch.compile(copy.deepcopy(model), backend="inductor")

    def stock(x: Any) -> Any:
        _torch_compat.mark_token_dim(x, 0)
        return stock_compiled(x)

    fns: dict[str, Callable[[Any], Any]] = {"eager": model, "inductor": stock, "fxpiece": ours}
    # Each its own inputs: marking a tensor's dim dynamic for one (as stock
    # needs) would make the other's guards reject it.
    inputs = {(n, k): torch.arange(n) % model.cfg.vocab_size for n in sizes for k in fns}
    times: dict[tuple[int, str], list[float]] = {(n, k): [] for n in sizes for k in fns}
    per_round = max(1, reps // rounds)
    names = list(fns)
    with torch.no_grad():
        for (_, name), x in inputs.items():  # compile or load, then settle
            for _ in range(3):
                fns[name](x)
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in sizes:
                for name in order:
                    fn, x = fns[name], inputs[(n, name)]
                    out = times[(n, name)]
                    for _ in range(per_round):
                        t0 = time.perf_counter()
                        fn(x)
                        out.append(time.perf_counter() - t0)
    return {str(n): {k: statistics.median(times[(n, k)]) for k in fns} for n in sizes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--threads", type=int)
    p.add_argument("--sizes", default="1,16,256")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    res = measure(
        a.cache_dir,
        a.layers,
        a.hidden,
        threads=a.threads,
        sizes=[int(s) for s in a.sizes.split(",")],
        reps=a.reps,
        rounds=a.rounds,
    )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
