"""N ranks starting together on an empty cache: fxpiece vs one folder per rank.

For N = 1, 2 and 4 ranks (processes started together, toy Llama split at
attention), prints the wall time until every rank has its first output, the
job's total Inductor compiles and compile seconds, and the processes' total
CPU seconds, for:
- fxpiece: one shared cache folder, per-piece leases (work stealing: each
  rank first compiles the pieces nobody is compiling, then waits for the
  rest), compiles bounded per host by compile slots;
- reference layout: one private cache folder per rank (each rank compiles);
- the floor: the same N ranks again on the now warm shared cache (what
  importing torch and tracing costs N processes on this machine).
Then the per-rank startup breakdown (``cm.stats.startup``, averaged over
the ranks: trace, key, wait, compile, load, first run).
Targets (2 cores): 4-rank wall <= 1.3x 1-rank, 2-rank <= 1.1x, total
compiles equal to the unique pieces.

The *excess* column is the compile part alone: wall minus that N's warm
floor, against N=1's (waiting ranks should only load: about 1.0x; target
<= 1.3x). ``--few`` runs the model with few unique pieces that shows it
best: 6 layers, one shape range and no exact sizes, so the 7 compiled
pieces are 3 unique graphs (first, the 5 identical middle ones, last).

    python benches/bench_ranks.py [--layers 4] [--dtype bfloat16] [--slots N] [--few]
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
from typing import Any

RANK = textwrap.dedent(
    """
    import json, os, sys, time
    go, cache, layers, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    slots = int(sys.argv[5]) if sys.argv[5] != "auto" else None
    few = sys.argv[6] == "few"
    import torch, fxpiece
    from fxpiece.toy_llama import ATTENTION_OP, ToyLlama, ToyLlamaConfig
    torch.manual_seed(0)
    m = ToyLlama(ToyLlamaConfig(num_layers=layers, hidden_size=256, intermediate_size=512,
                                num_heads=8)).eval().to(getattr(torch, dtype))
    cfg = fxpiece.CompileConfig(splitting_ops=[ATTENTION_OP],
                                compile_ranges_endpoints=[] if few else [16],
                                max_num_tokens=256, compile_sizes=[] if few else [8],
                                cache_dir=cache, max_parallel_compiles=slots)
    cm = fxpiece.compile(m, cfg)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    with torch.no_grad():
        cm(torch.arange(24))
    done = time.time()
    s = cm.stats
    print(json.dumps({"done": done, "compiles": s.counters.num_inductor_compiles,
                      "compile_s": s.compile_s, "hits": s.counters.num_cache_hits,
                      "startup": s.startup.as_dict(), "slots": s.max_parallel_compiles}),
          flush=True)
    """
)


BREAKDOWN = ("trace_s", "key_s", "wait_s", "compile_s", "load_s", "other_backend_s", "first_run_s")


def run(
    n: int,
    shared: bool,
    layers: int,
    dtype: str,
    slots: str,
    root: str | None = None,
    few: bool = False,
) -> dict[str, Any]:
    root = root or tempfile.mkdtemp(prefix="fxpiece-bench-ranks-")
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
                [
                    sys.executable,
                    script,
                    go,
                    cache,
                    str(layers),
                    dtype,
                    slots,
                    "few" if few else "-",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:  # all imported and traced up to the first call
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    if os.path.exists(go):
        os.unlink(go)
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
        "breakdown": {k: sum(r["startup"][k] for r in results) / n for k in BREAKDOWN},
        "slots": results[0]["slots"],
        "root": root,
    }


Row = tuple[int, dict[str, Any], dict[str, Any], dict[str, Any] | None]


def _measure(layers: int, dtype: str, slots: str, few: bool, reference: bool) -> list[Row]:
    """For N = 1, 2, 4: fxpiece cold, the warm floor on its folder and (when
    ``reference``) per-rank folders, a line printed per N; (N, cold, warm, ref)."""
    rows: list[Row] = []
    for n in (1, 2, 4):
        f = run(n, True, layers, dtype, slots, few=few)
        warm = run(n, True, layers, dtype, slots, root=f["root"], few=few)
        ref = run(n, False, layers, dtype, slots, few=few) if reference else None
        rows.append((n, f, warm, ref))
        print(
            f"N={n}: fxpiece wall {f['wall']:.2f} s, compiles {f['compiles']} "
            f"(slots per host {f['slots']}); warm floor {warm['wall']:.2f} s"
            + ("" if ref is None else f"; per-rank folders wall {ref['wall']:.2f} s"),
            flush=True,
        )
    return rows


def _print_table(rows: list[Row]) -> None:
    """One line per N: fxpiece's wall, compiles and CPU, the warm floor, the
    excess over it against N=1's, and the per-rank folders."""
    base = rows[0][1]["wall"]
    base_excess = rows[0][1]["wall"] - rows[0][2]["wall"]
    print(
        "\n ranks | fxpiece wall  vs 1 rank  compiles  compile s  CPU s | warm floor"
        "  wall - floor  excess vs 1 rank | per-rank folders wall  compiles  CPU s"
    )
    for n, f, w, r in rows:
        ref = "" if r is None else f"{r['wall']:21.2f}  {r['compiles']:8d}  {r['cpu_s']:5.1f}"
        excess = f["wall"] - w["wall"]
        print(
            f"{n:6d} | {f['wall']:11.2f}  {f['wall'] / base:8.2f}x  {f['compiles']:8d}  "
            f"{f['compile_s']:9.2f}  {f['cpu_s']:5.1f} | {w['wall']:10.2f}  {excess:12.2f}"
            f"  {excess / base_excess:15.2f}x | {ref}"
        )


def _print_breakdown(rows: list[Row]) -> None:
    """The cold runs' per-rank startup breakdown, one line per N."""
    print("\nper-rank startup breakdown, cold (mean over ranks, s):")
    print(" ranks | " + "  ".join(f"{k[:-2]:>9s}" for k in BREAKDOWN))
    for n, f, _, _ in rows:
        print(f"{n:6d} | " + "  ".join(f"{f['breakdown'][k]:9.2f}" for k in BREAKDOWN))


def _print_targets(rows: list[Row]) -> None:
    """The targets (2- and 4-rank wall, compiles, 4-rank excess) and the floor's ratio."""
    base = rows[0][1]["wall"]
    base_excess = rows[0][1]["wall"] - rows[0][2]["wall"]
    unique = rows[0][1]["compiles"]
    same = all(f["compiles"] == unique for _, f, _, _ in rows)
    r2 = rows[1][1]["wall"] / base
    r4 = rows[2][1]["wall"] / base
    print(
        f"\n2-rank wall <= 1.1x 1-rank: {r2:.2f}x {'PASS' if r2 <= 1.1 else 'FAIL'}; "
        f"4-rank wall <= 1.3x 1-rank: {r4:.2f}x {'PASS' if r4 <= 1.3 else 'FAIL'}; "
        f"total compiles == unique pieces ({unique}) for every N: {'PASS' if same else 'FAIL'}"
    )
    e4 = (rows[2][1]["wall"] - rows[2][2]["wall"]) / base_excess
    print(
        f"4-rank excess (wall - warm floor) <= 1.3x 1-rank's: {e4:.2f}x "
        f"{'PASS' if e4 <= 1.3 else 'FAIL'}"
    )
    floor4 = rows[2][2]["wall"] / rows[0][2]["wall"]
    print(f"floor: 4 warm ranks take {floor4:.2f}x one warm rank")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--slots", default="auto", help="max_parallel_compiles (default: automatic)")
    p.add_argument("--no-reference", action="store_true", help="skip the per-rank folders")
    p.add_argument(
        "--few",
        action="store_true",
        help="6 layers, one range, no exact sizes: 3 unique pieces (overrides --layers)",
    )
    a = p.parse_args()
    layers = 6 if a.few else a.layers
    print(
        f"toy Llama {layers} layers {a.dtype}, "
        + ("one range, no exact sizes" if a.few else "ranges [1,16] [17,256], exact size 8"),
        flush=True,
    )
    rows = _measure(layers, a.dtype, a.slots, a.few, not a.no_reference)
    _print_table(rows)
    _print_breakdown(rows)
    _print_targets(rows)


if __name__ == "__main__":
    main()
