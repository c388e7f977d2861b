"""Startup and steady-state benchmark of the piecewise backend.

Prints, in one run (every phase a fresh process on one cache folder):
- cold vs warm backend time (target: warm <= 10% of cold);
- warm start vs stock ``torch.compile(backend="inductor")`` warm start, both
  first-call wall time in a fresh process (target: not slower);
- steady-state latency at 1, 16 and 256 tokens vs whole-graph Inductor
  (target: <= 1.15x) and vs eager.

    python benches/bench_startup.py [--layers 4] [--hidden 256] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import tempfile

from fxpiece.demo import run_phase


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--reps", type=int, default=50)
    a = p.parse_args()
    a.latency_sizes = [1, 16, 256]
    d = tempfile.mkdtemp(prefix="fxpiece-bench-startup-")
    print(f"toy Llama {a.layers} layers, hidden {a.hidden}, {a.dtype}; cache {d}", flush=True)
    cold = run_phase("fxpiece", d, a)
    warm = run_phase("fxpiece", d, a)
    stock_cold = run_phase("inductor", d, a)
    stock_warm = run_phase("inductor", d, a)
    eager = run_phase("eager", d, a)

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    r = warm["backend_s"] / cold["backend_s"]
    print(
        f"\nbackend time: cold {cold['backend_s']:.2f} s, warm {warm['backend_s']:.2f} s "
        f"-> warm/cold {r:.3f} (target <= 0.10) {verdict(r <= 0.10)}"
    )
    print(
        f"  cold: compile {cold['compile_s']:.2f} s, Inductor compiles "
        f"{cold['counters']['num_inductor_compiles']}; warm: load {warm['load_s']:.2f} s, "
        f"Inductor compiles {warm['counters']['num_inductor_compiles']}, "
        f"hits {warm['counters']['num_cache_hits']}"
    )
    r2 = warm["first_call_s"] / stock_warm["first_call_s"]
    print(
        f"warm first call: fxpiece {warm['first_call_s']:.2f} s vs stock Inductor "
        f"{stock_warm['first_call_s']:.2f} s (stock cold {stock_cold['first_call_s']:.2f} s) "
        f"-> {r2:.2f}x (target <= 1.0) {verdict(r2 <= 1.0)}"
    )
    print(
        f"  whole process incl. imports: fxpiece {warm['process_s']:.2f} s, "
        f"stock {stock_warm['process_s']:.2f} s"
    )
    print("\nsteady state (median of runs)")
    print(
        f"{'tokens':>6}  {'eager ms':>9}  {'inductor ms':>11}  {'fxpiece ms':>10}  "
        f"{'vs inductor':>11}  {'vs eager':>8}"
    )
    for n in map(str, a.latency_sizes):
        f, i, e = warm["latency_s"][n], stock_warm["latency_s"][n], eager["latency_s"][n]
        print(
            f"{n:>6}  {e * 1e3:9.3f}  {i * 1e3:11.3f}  {f * 1e3:10.3f}  {f / i:10.2f}x  "
            f"{e / f:7.2f}x  {verdict(f / i <= 1.15)}"
        )


if __name__ == "__main__":
    main()
