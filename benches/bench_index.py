"""Benchmark: the shared cache index (fxpiece.CacheIndex) against reference approaches.

    python benches/bench_index.py [--dir DIR] [--quick]

(a) load + 1,000 lookups on a 5,000-entry index, vs the reference: a dict
    {(start, end, graph, "compiler"): ("hash", "relative/path")} written with
    pprint.pformat and read back with ast.literal_eval. Targets: >= 20x, aim 50x.
(b) commit throughput, p50/p99 commit latency and lost entries with 1, 8 and 64
    concurrent writer processes on indexes pre-filled with 0, 1,000 and 5,000
    entries, vs the same job done in Python: one JSON file, fcntl.flock on a
    sidecar lock, re-read + merge + temp file + fsync + rename + folder fsync per
    commit. Target: >= 5x the commits/s, 0 lost.
(c) single-writer commit cost at 100 vs 10,000 entries (mean, compaction
    amortised in), with fsync and without (the CPU cost). Target: <= 2x.

Both sides fsync (fxpiece's default). The folder defaults to the system temp
folder; pass --dir to bench another file system. Prints a report; exits 0.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import gc
import hashlib
import json
import multiprocessing as mp
import os
import platform
import pprint
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import fxpiece
from fxpiece import CacheIndex

Key = tuple[int, int, int, str]


def entry(i: int) -> tuple[Key, tuple[str, str]]:
    h = hashlib.sha256(str(i).encode()).hexdigest()
    return (i * 16, i * 16 + 16, i % 7, "inductor"), (h, f"artifacts/{h[:2]}/{h}/piece.so")


def fs_type(path: str) -> str:
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                if path.startswith(mnt) and len(mnt) > len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return f"{kind} at {best or '?'}"


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


# ----- the reference protocol, in Python ------------------------------------------


class PyJsonIndex:
    """One JSON file; every commit: flock, re-read, merge, temp, fsync, rename, fsync dir."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.dir = os.path.dirname(path)
        self.lock_path = path + ".lock"

    def load(self) -> dict[Key, Any]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        return {tuple(k): v for k, v in data["entries"]}  # type: ignore[misc]

    def commit(self, updates: dict[Key, Any]) -> None:
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                entries = self.load()
                entries.update(updates)
                body = json.dumps({"version": 1, "entries": [[k, v] for k, v in entries.items()]})
                tmp = f"{self.path}.tmp-{os.getpid()}-{random.getrandbits(32):08x}"
                try:
                    with open(tmp, "w", encoding="utf-8") as f:
                        f.write(body)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, self.path)
                except BaseException:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                    raise
                dfd = os.open(self.dir, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


# ----- (a) load + lookups ------------------------------------------------------------


def _index_with_logs(path: str, entries: dict[Key, tuple[str, str]]) -> int:
    """Write `entries` as a fxpiece index at `path`, snapshot plus logs; the number of logs."""
    # The same entries as a snapshot plus as many logs as there can be just
    # before a compaction (max(compact_after=64, entries / 32), see
    # ENTRIES_PER_LOG in rust/src/index.rs): what a cold reader meets at worst.
    n = len(entries)
    n_logs = max(64, n // 32) - 1
    idx2 = CacheIndex(path)
    items = [(k, list(v)) for k, v in entries.items()]
    idx2.update(dict(items[: n - n_logs * 10]))
    idx2.compact()
    for j in range(n_logs):
        start = n - n_logs * 10 + j * 10
        idx2.update(dict(items[start : start + 10]))
    assert sum(x.startswith("log-") for x in os.listdir(path)) == n_logs
    return n_logs


def _load_methods(
    fx_path: str, fx_logs: str, n_logs: int, ref_path: str, keys: list[Key]
) -> dict[str, Callable[[], int]]:
    """The timed jobs of (a), by row name: each loads an index (and looks `keys` up)."""

    def fx(path: str) -> Callable[[], int]:
        def run() -> int:
            i = CacheIndex(path)
            return sum(i.get(k) is not None for k in keys)

        return run

    def fx_load_only() -> int:
        return len(CacheIndex(fx_path))

    def ref() -> int:
        with open(ref_path, encoding="utf-8") as f:
            m = ast.literal_eval(f.read())
        return sum(m.get(k) is not None for k in keys)

    def ref_load_only() -> int:
        with open(ref_path, encoding="utf-8") as f:
            return len(ast.literal_eval(f.read()))

    return {
        "fxpiece": fx(fx_path),
        f"fxpiece, snapshot + {n_logs} logs": fx(fx_logs),
        "fxpiece, load only": fx_load_only,
        "reference": ref,
        "reference, load only": ref_load_only,
    }


def _time_rounds(methods: dict[str, Callable[[], int]], runs: int) -> dict[str, list[float]]:
    """Call every method once per round, `runs` rounds; the seconds of each call, by method."""
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(runs):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def bench_load(root: str, n: int, lookups: int, runs: int) -> dict[str, Any]:
    d = os.path.join(root, "load")
    os.makedirs(d)
    entries = dict(entry(i) for i in range(n))
    keys = random.Random(0).choices(list(entries), k=lookups)

    fx_path = os.path.join(d, "fx-compacted")
    idx = CacheIndex(fx_path)
    idx.update({k: list(v) for k, v in entries.items()})
    idx.compact()
    fx_logs = os.path.join(d, "fx-with-logs")
    n_logs = _index_with_logs(fx_logs, entries)

    ref_path = os.path.join(d, "reference.txt")
    with open(ref_path, "w", encoding="utf-8") as f:
        f.write(pprint.pformat(entries))

    methods = _load_methods(fx_path, fx_logs, n_logs, ref_path, keys)
    for name, fn in methods.items():  # warm-up and sanity
        got = fn()
        assert got == (n if "load only" in name else lookups), (name, got)
    times = _time_rounds(methods, runs)
    med = {m: statistics.median(ts) for m, ts in times.items()}
    snap = next(x for x in os.listdir(fx_path) if x.startswith("snap-"))
    return {
        "med": med,
        "best": {m: min(ts) for m, ts in times.items()},
        "fx_bytes": os.path.getsize(os.path.join(fx_path, snap)),
        "ref_bytes": os.path.getsize(ref_path),
    }


# ----- (b) concurrent commits ---------------------------------------------------------


def _writer(
    kind: str,
    path: str,
    wid: int,
    quota: int,
    budget_s: float,
    barrier: Any,
    conn: Connection,
) -> None:
    lat: list[float] = []
    err = None
    try:
        if kind == "fxpiece":
            idx = CacheIndex(path)

            def commit(k: Key, v: Any) -> None:
                idx.insert(k, v)

        else:
            py = PyJsonIndex(path)

            def commit(k: Key, v: Any) -> None:
                py.commit({k: v})

        barrier.wait(timeout=300)
        deadline = time.perf_counter() + budget_s
        for i in range(quota):
            if time.perf_counter() > deadline:
                break
            t0 = time.perf_counter()
            commit((wid, i, 99, "bench"), ["h", f"p/{wid}/{i}"])
            lat.append(time.perf_counter() - t0)
    except BaseException as e:
        err = repr(e)
    conn.send((lat, err))
    conn.close()


def durable_file_floor(root: str, commits: int) -> dict[str, float]:
    """One writer creating small files durably and nothing else (temp, write,
    fsync, rename, folder fsync): what any commit that must survive a power
    cut costs at least on this file system."""
    d = tempfile.mkdtemp(prefix="floor-", dir=root)
    lat = []
    t0 = time.perf_counter()
    for i in range(commits):
        c0 = time.perf_counter()
        tmp = os.path.join(d, f".tmp-{i}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, b"x" * 300)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(d, f"log-{i}"))
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        lat.append(time.perf_counter() - c0)
    rate = commits / (time.perf_counter() - t0)
    shutil.rmtree(d, ignore_errors=True)
    return {"rate": rate, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99)}


def prefill(kind: str, path: str, n: int) -> None:
    entries = {k: list(v) for k, v in (entry(i) for i in range(n))}
    if kind == "fxpiece":
        idx = CacheIndex(path)
        if entries:
            idx.update(entries)
        idx.compact()
    else:
        PyJsonIndex(path).commit(entries)


def present_keys(kind: str, path: str) -> set[Key]:
    if kind == "fxpiece":
        return set(CacheIndex(path).keys())
    return set(PyJsonIndex(path).load())


def run_commits(
    root: str, kind: str, writers: int, pre: int, total: int, budget_s: float
) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix=f"{kind}-{writers}w-{pre}e-", dir=root)
    path = os.path.join(d, "index") if kind == "fxpiece" else os.path.join(d, "index.json")
    prefill(kind, path, pre)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(writers + 1)
    quota = max(1, total // writers)
    procs, pipes = [], []
    for w in range(writers):
        r, s = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_writer, args=(kind, path, w, quota, budget_s, barrier, s))
        p.start()
        s.close()
        procs.append(p)
        pipes.append(r)
    barrier.wait(timeout=300)
    t0 = time.perf_counter()
    lat: list[float] = []
    errors: list[str] = []
    done = []
    for w, r in enumerate(pipes):
        try:
            ls, err = r.recv()
        except EOFError:
            ls, err = [], "writer died"
        lat.extend(ls)
        done.append(len(ls))
        if err:
            errors.append(f"w{w}: {err}")
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    expected = {(w, i, 99, "bench") for w in range(writers) for i in range(done[w])}
    expected |= {entry(i)[0] for i in range(pre)}
    lost = len(expected - present_keys(kind, path))
    shutil.rmtree(d, ignore_errors=True)
    return {
        "commits": len(lat),
        "rate": len(lat) / elapsed if elapsed > 0 else float("nan"),
        "p50": pct(lat, 0.50),
        "p99": pct(lat, 0.99),
        "lost": lost,
        "errors": errors,
    }


# ----- (c) commit cost vs index size --------------------------------------------------


def commit_cost(
    root: str, sizes: tuple[int, ...], block: int, rounds: int, kind: str, fsync: bool = True
) -> dict[int, dict[str, float]]:
    """Mean single-entry commit cost on indexes of each size, the sizes taking
    turns in blocks of `block` commits (so disk noise spreads over all of
    them). Commits overwrite keys: every index keeps its size."""
    commits: dict[int, Callable[[Key, Any], None]] = {}
    keys: dict[int, list[Key]] = {}
    dirs = []
    for n in sizes:
        d = tempfile.mkdtemp(prefix=f"cost-{kind}-{n}-", dir=root)
        dirs.append(d)
        path = os.path.join(d, "index") if kind == "fxpiece" else os.path.join(d, "index.json")
        prefill(kind, path, n)
        keys[n] = [entry(i)[0] for i in range(n)]
        if kind == "fxpiece":
            commits[n] = CacheIndex(path, fsync=fsync).insert
        else:
            py = PyJsonIndex(path)
            commits[n] = lambda k, v, py=py: py.commit({k: v})
    total = dict.fromkeys(sizes, 0.0)
    lat: dict[int, list[float]] = {n: [] for n in sizes}
    j = 0
    for _ in range(rounds):
        for n in sizes:
            commit, ks = commits[n], keys[n]
            t0 = time.perf_counter()
            for _ in range(block):
                c0 = time.perf_counter()
                commit(ks[j % n], ["h2", f"p/{j}"])
                lat[n].append(time.perf_counter() - c0)
                j += 1
            total[n] += time.perf_counter() - t0
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return {
        n: {
            "mean": total[n] / (block * rounds),
            "p50": pct(lat[n], 0.5),
            "p99": pct(lat[n], 0.99),
        }
        for n in sizes
    }


# ----- report -----------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _print_header(root: str) -> None:
    """The report's first lines: versions, CPUs, the folder and its file system, the load."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print("fxpiece bench_index")
    print(
        f"  python {platform.python_version()}, fxpiece {fxpiece.__version__}, "
        f"{os.cpu_count()} CPUs, folder {root} ({fs_type(root)}), fsync on\n"
        f"  load average at start: {load}"
    )


def _report_load(root: str, quick: bool) -> None:
    """(a): measure load + 1,000 lookups on 5,000 entries and print the table and target."""
    runs = 3 if quick else 15
    a = bench_load(root, 5000, 1000, runs)
    med, best = a["med"], a["best"]
    ratio = med["reference"] / med["fxpiece"]
    print()
    print(f"(a) load + 1,000 lookups, 5,000 entries ({runs} runs; ratios vs the reference)")
    print(f"    {'':<30} {'median ms':>9} {'ratio':>7} {'best ms':>8} {'ratio':>7}")
    for m in med:
        ref = "reference, load only" if "load only" in m else "reference"
        print(
            f"    {m:<30} {med[m] * 1e3:>9.2f} {med[ref] / med[m]:>6.1f}x "
            f"{best[m] * 1e3:>8.2f} {best[ref] / best[m]:>6.1f}x"
        )
    print(
        f"    files: fxpiece snapshot {a['fx_bytes'] / 1024:.0f} KiB, "
        f"reference {a['ref_bytes'] / 1024:.0f} KiB"
    )
    print(
        f"    reference / fxpiece (medians) = {ratio:.1f}x   target >= 20x "
        f"{verdict(ratio >= 20)}, aim 50x {verdict(ratio >= 50)}"
        f"   (best-of-{runs}: {best['reference'] / best['fxpiece']:.1f}x)"
    )


def _commit_rows(root: str, total: int, budget: float) -> tuple[float, int, list[str]]:
    """(b)'s table: run and print one row per prefill size and writer count; the worst
    fxpiece / python ratio, fxpiece's lost entries and the writers' errors."""
    worst = float("inf")
    lost_total = 0
    all_errors = []
    for pre in (0, 1000, 5000):
        for writers in (1, 8, 64):
            fx = run_commits(root, "fxpiece", writers, pre, total, budget)
            py = run_commits(root, "python", writers, pre, total, budget)
            x = fx["rate"] / py["rate"]
            worst = min(worst, x)
            lost_total += fx["lost"]
            all_errors += [f"fxpiece {writers}w/{pre}: {e}" for e in fx["errors"]]
            all_errors += [f"python {writers}w/{pre}: {e}" for e in py["errors"]]
            print(
                f"    {writers:>7} {pre:>7} | {fx['rate']:>11.0f} {fx['p50'] * 1e3:>7.2f} "
                f"{fx['p99'] * 1e3:>7.2f} {fx['lost']:>4} | {py['rate']:>10.0f} "
                f"{py['p50'] * 1e3:>7.2f} {py['p99'] * 1e3:>7.2f} {py['lost']:>4} | "
                f"{x:>5.1f}x",
                flush=True,
            )
    return worst, lost_total, all_errors


def _report_commits(root: str, quick: bool) -> None:
    """(b): the durable-file floor, then the concurrent commit table and its targets."""
    total = 400 if quick else 1600
    budget = 1.5 if quick else 4.0
    print()
    print(
        f"(b) concurrent commits: {total} commits split over the writers "
        f"(each stops after {budget:.0f} s), one entry per commit"
    )
    floor = durable_file_floor(root, 200 if quick else 800)
    hdr = (
        f"    {'writers':>7} {'entries':>7} | {'fxpiece c/s':>11} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'lost':>4} | {'python c/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'lost':>4} | {'x':>6}"
    )
    print(hdr)
    print("    " + "-" * (len(hdr) - 4))
    worst, lost_total, all_errors = _commit_rows(root, total, budget)
    for e in all_errors:
        print(f"    ERROR {e}")
    print(
        f"    floor: bare durable file creation, 1 writer, no index: {floor['rate']:.0f} c/s, "
        f"p50 {floor['p50'] * 1e3:.2f} ms, p99 {floor['p99'] * 1e3:.2f} ms (measured before "
        "the table: temp + write + fsync + rename + folder fsync, what any commit that must "
        "survive a power cut costs at least)"
    )
    print(
        f"    fxpiece / python commits/s: worst {worst:.1f}x   target >= 5x "
        f"{verdict(worst >= 5)};  fxpiece lost entries: {lost_total}   target 0 "
        f"{verdict(lost_total == 0 and not all_errors)}"
    )


CostRows = list[tuple[str, dict[str, float]]]


def _measure_commit_cost(
    root: str, cpu_root: str, block: int, rounds: int, py_block: int, n_trials: int
) -> tuple[CostRows, list[float]]:
    """(c)'s figures: the table's rows (fxpiece with fsync, without, python) and the
    10,000 / 100 ratio of every fsync-on trial."""
    # With fsync the figures swing from run to run with the disk (and with
    # where the file system puts each fresh folder): three trials with
    # fresh folders, the one with the median ratio is shown.
    trials = [commit_cost(root, (100, 10_000), block, rounds, "fxpiece") for _ in range(n_trials)]
    trial_ratios = [t[10_000]["mean"] / t[100]["mean"] for t in trials]
    on = sorted(trials, key=lambda t: t[10_000]["mean"] / t[100]["mean"])[len(trials) // 2]
    off = commit_cost(cpu_root, (100, 10_000), block, rounds, "fxpiece", fsync=False)
    py = commit_cost(root, (100, 10_000), py_block, 3, "python")
    rows = [
        ("fxpiece, 100 entries", on[100]),
        ("fxpiece, 10,000 entries", on[10_000]),
        ("  fsync off, 100", off[100]),
        ("  fsync off, 10,000", off[10_000]),
        ("python, 100 entries", py[100]),
        ("python, 10,000 entries", py[10_000]),
    ]
    return rows, trial_ratios


def _report_commit_cost(root: str, cpu_root: str, quick: bool) -> None:
    """(c): measure single-writer commit cost at 100 vs 10,000 entries; print the table."""
    # Compaction runs every max(64, entries / 32) commits: 64 at 100
    # entries, 312 at 10,000. Blocks of 312 commits, 4 rounds: 4 whole
    # cycles at 10,000 (19.5 at 100), so both means include their share.
    block, rounds = 312, (1 if quick else 4)
    commits = block * rounds
    py_block = 8 if quick else 16
    rows, trial_ratios = _measure_commit_cost(
        root, cpu_root, block, rounds, py_block, 1 if quick else 3
    )
    py_commits = py_block * 3
    c = dict(rows)
    r = c["fxpiece, 10,000 entries"]["mean"] / c["fxpiece, 100 entries"]["mean"]
    r_cpu = c["  fsync off, 10,000"]["mean"] / c["  fsync off, 100"]["mean"]
    r_py = c["python, 10,000 entries"]["mean"] / c["python, 100 entries"]["mean"]
    print()
    print(
        f"(c) single-writer commit cost: mean over {commits} commits, compaction amortised in "
        f"(median of {len(trial_ratios)} trials; python: {py_commits} commits; "
        f"fsync off rows in {fs_type(cpu_root)})"
    )
    print(f"    {'':<24} {'mean ms':>8} {'p50 ms':>7} {'p99 ms':>7}")
    for name, row in rows:
        print(
            f"    {name:<24} {row['mean'] * 1e3:>8.3f} {row['p50'] * 1e3:>7.3f} "
            f"{row['p99'] * 1e3:>7.3f}"
        )
    print(
        f"    fxpiece 10,000 / 100 = {r:.2f}x   target <= 2x {verdict(r <= 2)}"
        f"   (fsync off: {r_cpu:.2f}x {verdict(r_cpu <= 2)}; python: {r_py:.1f}x)"
    )
    print("    fsync on, all trials: " + ", ".join(f"{x:.2f}x" for x in trial_ratios))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where to put the indexes (default: temp)")
    ap.add_argument("--quick", action="store_true", help="fewer runs and commits (smoke test)")
    args = ap.parse_args()

    # `import fxpiece` imports torch: freeze its millions of objects out of the
    # cyclic GC, whose full collections would otherwise land at random in the
    # timed code (mostly in the reference's ast.literal_eval).
    gc.freeze()
    t_start = time.perf_counter()
    root = tempfile.mkdtemp(prefix="fxpiece-bench-index-", dir=args.dir)
    # The fsync-off rows of (c) measure CPU: on tmpfs when there is one (on a
    # disk file system without fsync, inode allocation under create/delete
    # churn dominates and drifts).
    cpu_root = tempfile.mkdtemp(
        prefix="fxpiece-bench-index-", dir="/dev/shm" if os.path.isdir("/dev/shm") else root
    )
    _print_header(root)
    try:
        _report_load(root, args.quick)
        _report_commits(root, args.quick)
        _report_commit_cost(root, cpu_root, args.quick)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(cpu_root, ignore_errors=True)
    print()
    print(f"total bench time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # Skip interpreter teardown: torch's extension modules print leak reports
    # at exit that have nothing to do with this bench.
    os._exit(0)
