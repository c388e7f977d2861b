"""Benchmark cache hashing: every .py file of the installed torch package,
or your own traced files.

    fxpiece bench hash [PATH ...] [--runs N] [--json]
    python benches/bench_hash.py [PATH ...] [--runs N]

PATHs are files, or folders whose ``.py`` files are taken (default: the
installed torch sources).

Compares, on the same file list with the page cache warm:

* fxpiece:   ``fxpiece.hash_files(paths)`` (BLAKE3, files read in parallel in Rust);
* reference: read every file in Python as text, join paths and contents with
  newlines, one ``hashlib.sha256`` over the result;
* floor:     just reading the bytes of every file (``open(p, "rb").read()`` in a
  loop), the least a one-thread Python hasher could cost; also the same reads
  spread over a thread pool (the "parallel floor") for context.

Targets (issue 2): fxpiece >= 10x faster than the reference, and within 1.5x
of the read floor. Prints a report; exits 0 (1 if there is nothing to hash).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fxpiece.hashing import hash_files, hash_files_report


def torch_py_files() -> tuple[str, list[str]]:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("torch is not installed: nothing to hash")
    root = next(iter(spec.submodule_search_locations))
    return root, collect([root])


def collect(paths: list[str]) -> list[str]:
    """Files as given, and the ``.py`` files under each folder, sorted."""
    files: set[str] = set()
    for p in paths:
        if os.path.isdir(p):
            for d, _, names in os.walk(p):
                files.update(os.path.join(d, n) for n in names if n.endswith(".py"))
        else:
            files.add(p)
    return sorted(files)


def reference(files: list[str]) -> str:
    parts = []
    for p in files:
        with open(p, encoding="utf-8", errors="surrogateescape") as f:
            parts.append(p)
            parts.append(f.read())
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


def read_floor(files: list[str]) -> int:
    n = 0
    for p in files:
        with open(p, "rb") as f:
            n += len(f.read())
    return n


def _read_one(p: str) -> int:
    with open(p, "rb") as f:
        return len(f.read())


_FX = "fxpiece.hash_files"
_REF = "reference (sha256)"
_FLOOR = "read floor"


@dataclass(frozen=True, slots=True)
class _Figures:
    """What one benchmark measured: seconds per method name, over ``runs``."""

    files: int
    bytes: int
    skipped: int
    """Files ``hash_files`` skipped."""
    runs: int
    workers: int
    median: dict[str, float]
    best: dict[str, float]
    cpu: dict[str, float]
    """Median process CPU time (all threads)."""

    @property
    def parallel_floor(self) -> str:
        """The parallel floor's method name."""
        return f"parallel floor ({self.workers} threads)"


def _arg_parser() -> argparse.ArgumentParser:
    """The options of ``fxpiece bench hash``."""
    ap = argparse.ArgumentParser(
        prog="fxpiece bench hash", description=(__doc__ or "").split("\n\n")[0]
    )
    ap.add_argument("paths", nargs="*", help="files or folders (default: torch's sources)")
    ap.add_argument("--runs", type=int, default=15, help="timed runs per method (default 15)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    return ap


def _methods(pool: ThreadPoolExecutor, workers: int) -> dict[str, Callable[[list[str]], object]]:
    """The methods compared, by name (the parallel floor reads on ``pool``)."""

    def parallel_floor(files: list[str]) -> int:
        return sum(pool.map(_read_one, files, chunksize=64))

    return {
        _FX: hash_files,
        _REF: reference,
        _FLOOR: read_floor,
        f"parallel floor ({workers} threads)": parallel_floor,
    }


def _time_interleaved(
    methods: dict[str, Callable[[list[str]], object]], files: list[str], runs: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and process CPU seconds of ``runs`` calls of each method."""
    times: dict[str, list[float]] = {name: [] for name in methods}
    cpu: dict[str, list[float]] = {name: [] for name in methods}
    # Interleave the methods so background noise hits them alike.
    for _ in range(runs):
        for name, fn in methods.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn(files)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)  # all threads of this process
    return times, cpu


def _measure(files: list[str], runs: int, workers: int) -> _Figures:
    """Warm the page cache, then time every method ``runs`` times on ``files``."""
    total = sum(os.path.getsize(p) for p in files if os.path.isfile(p))
    pool = ThreadPoolExecutor(max_workers=workers)
    methods = _methods(pool, workers)
    # Warm the page cache (and every code path) before timing.
    for _ in range(2):
        for fn in methods.values():
            fn(files)
    report = hash_files_report(files)
    times, cpu = _time_interleaved(methods, files, runs)
    pool.shutdown()
    return _Figures(
        files=len(files),
        bytes=total,
        skipped=len(report.skipped),
        runs=runs,
        workers=workers,
        median={n: statistics.median(ts) for n, ts in times.items()},
        best={n: min(ts) for n, ts in times.items()},
        cpu={n: statistics.median(ts) for n, ts in cpu.items()},
    )


def _as_json(fig: _Figures) -> dict[str, Any]:
    """The figures as ``--json`` prints them."""
    med = fig.median
    return {
        "files": fig.files,
        "bytes": fig.bytes,
        "skipped": fig.skipped,
        "runs": fig.runs,
        "median_s": med,
        "best_s": fig.best,
        "cpu_s": fig.cpu,
        "reference_over_fxpiece": med[_REF] / med[_FX],
        "fxpiece_over_floor": med[_FX] / med[_FLOOR],
    }


def _print_table(fig: _Figures, root: str, load: str) -> None:
    """The header (what was hashed, on what) and one row per method."""
    total, med = fig.bytes, fig.median
    print(f"fxpiece bench hash: {root}")
    print(
        f"  python {platform.python_version()}, {fig.workers} CPUs, torch dir {root}\n"
        f"  {fig.files} files, {total / 2**20:.1f} MiB, "
        f"{fig.skipped} skipped by fxpiece; page cache warm; {fig.runs} runs each\n"
        f"  load average before the runs: {load}"
    )
    print()
    print(f"  {'method':<28} {'median ms':>10} {'best ms':>9} {'CPU ms':>8} {'MiB/s':>7}")
    for n in med:
        print(
            f"  {n:<28} {med[n] * 1e3:>10.1f} {fig.best[n] * 1e3:>9.1f} "
            f"{fig.cpu[n] * 1e3:>8.1f} {total / 2**20 / med[n]:>7.0f}"
        )
    print("  (CPU ms: median process CPU time over all threads; MiB/s from the median)")


def _print_targets(fig: _Figures) -> None:
    """The ratios against the targets (median), then the best-of ones."""
    med, best = fig.median, fig.best
    speedup = med[_REF] / med[_FX]
    vs_floor = med[_FX] / med[_FLOOR]
    vs_pfloor = med[_FX] / med[fig.parallel_floor]
    ok1, ok2 = speedup >= 10.0, vs_floor <= 1.5
    print(
        f"  reference / fxpiece   = {speedup:6.1f}x   target >= 10x    {'PASS' if ok1 else 'FAIL'}"
    )
    print(
        f"  fxpiece / read floor  = {vs_floor:6.2f}x   target <= 1.5x   {'PASS' if ok2 else 'FAIL'}"
    )
    print(f"  fxpiece / par. floor  = {vs_pfloor:6.2f}x   (context: reads alone, on all CPUs)")
    b_speedup = best[_REF] / best[_FX]
    b_floor = best[_FX] / best[_FLOOR]
    print(
        f"  (best-of-{fig.runs}: reference / fxpiece = {b_speedup:.1f}x,"
        f" fxpiece / floor = {b_floor:.2f}x)"
    )


def main(argv: list[str] | None = None) -> int:
    args = _arg_parser().parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.paths:
        root, files = ", ".join(args.paths), collect(args.paths)
    else:
        root, files = torch_py_files()
    if not files:
        print("fxpiece bench hash: no files to hash", file=sys.stderr)
        return 1
    fig = _measure(files, args.runs, os.cpu_count() or 1)
    if args.json:
        print(json.dumps(_as_json(fig)))
        return 0
    _print_table(fig, root, load)
    print()
    _print_targets(fig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
