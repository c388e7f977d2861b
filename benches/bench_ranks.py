"""N ranks starting together on an empty cache: fxpiece vs one folder per rank.

For N = 1, 2 and 4 ranks (processes started together, toy Llama BF16 split at
attention), prints the wall time until every rank has its first output, the
job's total Inductor compiles and compile seconds, and the processes' total
CPU seconds, for:
- fxpiece: one shared cache folder, per-piece leases (single-flight);
- reference layout: one private cache folder per rank (each rank compiles).
Target: fxpiece's N-rank wall <= 1.3x its 1-rank wall, total compiles equal
to the unique pieces.

    python benches/bench_ranks.py [--layers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time

RANK = textwrap.dedent(
    """
    import json, os, sys, time
    go, cache, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    import torch, fxpiece
    from fxpiece.toy_llama import ATTENTION_OP, ToyLlama, ToyLlamaConfig
    torch.manual_seed(0)
    m = ToyLlama(ToyLlamaConfig(num_layers=layers, hidden_size=256, intermediate_size=512,
                                num_heads=8)).eval().to(torch.bfloat16)
    cfg = fxpiece.CompileConfig(splitting_ops=[ATTENTION_OP], compile_ranges_endpoints=[16],
                                max_num_tokens=256, compile_sizes=[8], cache_dir=cache)
    cm = fxpiece.compile(m, cfg)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    with torch.no_grad():
        cm(torch.arange(24))
    done = time.time()
    s = cm.stats
    print(json.dumps({"done": done, "compiles": s.counters.num_inductor_compiles,
                      "compile_s": s.compile_s, "hits": s.counters.num_cache_hits}), flush=True)
    """
)


def run(n: int, shared: bool, layers: int) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="fxpiece-bench-ranks-")
    script = os.path.join(root, "rank.py")
    with open(script, "w") as f:
        f.write(RANK)
    go = os.path.join(root, "go")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = []
    for r in range(n):
        cache = os.path.join(root, "cache" if shared else f"cache-rank{r}")
        procs.append(
            subprocess.Popen(
                [sys.executable, script, go, cache, str(layers)], stdout=subprocess.PIPE, text=True
            )
        )
    for p in procs:  # all imported and traced up to the first call
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    t0 = time.time()
    open(go, "w").close()
    results = []
    for p in procs:
        out, _ = p.communicate()
        assert p.returncode == 0
        results.append(json.loads(out.strip().splitlines()[-1]))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall": max(r["done"] for r in results) - t0,
        "compiles": sum(r["compiles"] for r in results),
        "compile_s": sum(r["compile_s"] for r in results),
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args()
    rows = []
    for n in (1, 2, 4):
        f = run(n, True, a.layers)
        ref = run(n, False, a.layers)
        rows.append((n, f, ref))
        print(
            f"N={n}: fxpiece wall {f['wall']:.2f} s, compiles {f['compiles']}; "
            f"per-rank folders wall {ref['wall']:.2f} s, compiles {ref['compiles']}",
            flush=True,
        )
    base = rows[0][1]["wall"]
    print(
        "\n ranks | fxpiece wall  vs 1 rank  compiles  compile s  CPU s "
        "| per-rank folders wall  compiles  compile s  CPU s"
    )
    for n, f, r in rows:
        print(
            f"{n:6d} | {f['wall']:11.2f}  {f['wall'] / base:8.2f}x  {f['compiles']:8d}  "
            f"{f['compile_s']:9.2f}  {f['cpu_s']:5.1f} | {r['wall']:21.2f}  {r['compiles']:8d}  "
            f"{r['compile_s']:9.2f}  {r['cpu_s']:5.1f}"
        )
    worst = max(f["wall"] for _, f, _ in rows) / base
    unique = rows[0][1]["compiles"]
    same = all(f["compiles"] == unique for _, f, _ in rows)
    print(
        f"\nfxpiece N-rank wall <= 1.3x 1-rank wall: {worst:.2f}x "
        f"{'PASS' if worst <= 1.3 else 'FAIL'}; total compiles == unique pieces ({unique}) "
        f"for every N: {'PASS' if same else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
