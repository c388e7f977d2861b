"""A fleet on one Redis: N hosts, each with its own empty cache root, started
together (``CompileConfig.remote_cache``; :mod:`fxpiece.piecewise.remote_tier`).

For N = 1, 2 and 4 processes (each its own cache root and Inductor folder;
its own host name where ``unshare --uts`` is allowed; one private
``redis-server``, an empty database per N; the toy Llama of bench_ranks,
split at attention), prints:

- the wall time from "go" until every process has its first output, and the
  fleet's total Inductor compiles (target: the unique pieces, for every N);
- the warm floor: the same N processes again on their now warm roots (what
  importing, tracing and loading cost N processes on this machine);
- the excess ratio: (wall N - floor N) / (wall 1 - floor 1), target <= 1.3x;
- a warm start from Redis with an empty root vs a warm start from the local
  root (one process, the first call's seconds, median of ``--reps``),
  target <= 1.2x.

Every process signs with one throwaway builder key (a fleet's shared key);
nothing touches the user's key or cache.

    python benches/bench_fleet.py [--layers 4] [--dtype bfloat16] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from redis_private import private_server

HOST = textwrap.dedent(
    """
    import json, os, sys, time
    go, cache, url, layers, dtype = sys.argv[1:6]
    import torch, fxpiece
    from fxpiece.toy_llama import ATTENTION_OP, ToyLlama, ToyLlamaConfig
    torch.manual_seed(0)
    m = ToyLlama(ToyLlamaConfig(num_layers=int(layers), hidden_size=256, intermediate_size=512,
                                num_heads=8)).eval().to(getattr(torch, dtype))
    cfg = fxpiece.CompileConfig(splitting_ops=[ATTENTION_OP], compile_ranges_endpoints=[16],
                                max_num_tokens=256, compile_sizes=[8], cache_dir=cache,
                                remote_cache=url or None)
    cm = fxpiece.compile(m, cfg)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    t0 = time.perf_counter()
    with torch.no_grad():
        cm(torch.arange(24))
    first = time.perf_counter() - t0
    c = cm.stats.counters
    print(json.dumps({"done": time.time(), "first_s": first,
                      "compiles": c.num_inductor_compiles, "remote_hits": c.num_remote_hits,
                      "refused": c.num_untrusted_remote, "errors": c.num_remote_errors,
                      "start": cm.start.path if cm.start else None,
                      "startup": cm.stats.startup.as_dict()}), flush=True)
    """
)


BREAKDOWN = ("trace_s", "key_s", "wait_s", "compile_s", "load_s", "other_backend_s", "first_run_s")


def uts_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--user", "--map-root-user", "--uts", "hostname", "fxpiece-probe"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


class Fleet:
    def __init__(self, base: Path, port: int, layers: int, dtype: str) -> None:
        self.base = base
        self.port = port
        self.layers = layers
        self.dtype = dtype
        self.uts = uts_works()
        self.script = base / "host.py"
        self.script.write_text(HOST)
        self.env = {
            **os.environ,
            "XDG_CONFIG_HOME": str(base / "config"),
            "FXPIECE_KEY_FILE": str(base / "config" / "fleet-key" / "key"),
        }
        self.env.pop("FXPIECE_TRUSTED_KEYS", None)

    def run(self, homes: list[str], db: int | None) -> dict[str, Any]:
        """Start one process per home (its root and Inductor folder), all at
        once; ``db``: the Redis database (``None``: no remote tier)."""
        url = "" if db is None else f"redis://127.0.0.1:{self.port}/{db}"
        go = self.base / f"go-{time.monotonic_ns()}"
        procs = []
        for i, home in enumerate(homes):
            folder = self.base / home
            folder.mkdir(exist_ok=True)
            argv = [sys.executable, str(self.script), str(go), str(folder / "root"), url]
            argv += [str(self.layers), self.dtype]
            if self.uts:
                argv = [
                    *("unshare", "--user", "--map-root-user", "--uts", "sh", "-c"),
                    f"hostname fleet-{i} && exec {shlex.join(argv)}",
                ]
            env = {**self.env, "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor")}
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        t0 = time.time()
        go.touch()
        results = []
        for p in procs:
            out, _ = p.communicate()
            assert p.returncode == 0, out
            results.append(json.loads(out.strip().splitlines()[-1]))
        return {
            "wall": max(r["done"] for r in results) - t0,
            "compiles": sum(r["compiles"] for r in results),
            "first_s": [r["first_s"] for r in results],
            "remote_hits": sum(r["remote_hits"] for r in results),
            "refused": sum(r["refused"] for r in results),
            "errors": sum(r["errors"] for r in results),
            "starts": [r["start"] for r in results],
            "breakdown": {
                k: sum(r["startup"][k] for r in results) / len(results) for k in BREAKDOWN
            },
        }


FleetRow = tuple[int, dict[str, Any], dict[str, Any]]


def _cold_and_floor(fleet: Fleet, sizes: list[int]) -> list[FleetRow]:
    """For each fleet size N: N fresh hosts cold on database N, then again
    warm (the floor), a line printed per N; (N, cold, floor)."""
    rows = []
    for n in sizes:
        homes = [f"n{n}-host{i}" for i in range(n)]
        cold = fleet.run(homes, n)
        floor = fleet.run(homes, n)
        rows.append((n, cold, floor))
        print(
            f"N={n}: wall {cold['wall']:.2f} s, compiles {cold['compiles']}, "
            f"pulled {cold['remote_hits']}; warm floor {floor['wall']:.2f} s "
            f"(compiles {floor['compiles']})",
            flush=True,
        )
    return rows


def _warm_starts(fleet: Fleet, n: int, reps: int) -> tuple[list[float], list[float]]:
    """``reps`` pairs of one-process warm starts on database ``n``: from Redis
    with an empty root, then from the warm root of host 0 of the fleet of
    ``n``; the first call's seconds of each (from Redis, from local)."""
    from_redis, from_local = [], []
    for r in range(reps):
        got = fleet.run([f"redis-warm-{r}"], n)  # empty root, a warm database
        assert got["compiles"] == 0 and got["refused"] == got["errors"] == 0, got
        from_redis.append(got["first_s"][0])
        local = fleet.run([f"n{n}-host0"], n)  # the base's warm root
        assert local["compiles"] == 0 and local["remote_hits"] == 0, local
        from_local.append(local["first_s"][0])
    return from_redis, from_local


def _print_tables(rows: list[FleetRow]) -> None:
    """The wall / floor / excess table and the cold per-host startup breakdown."""
    base = rows[0][1]["wall"] - rows[0][2]["wall"]
    print("\n hosts |  wall s  compiles | warm floor s | wall - floor  excess vs N=1")
    for n, cold, floor in rows:
        excess = cold["wall"] - floor["wall"]
        print(
            f"{n:6d} | {cold['wall']:7.2f}  {cold['compiles']:8d} | {floor['wall']:12.2f} | "
            f"{excess:12.2f}  {excess / base:11.2f}x"
        )
    print("\nper-host startup breakdown, cold (mean over hosts, s):")
    print(" hosts | " + "  ".join(f"{k[:-2]:>9s}" for k in BREAKDOWN))
    for n, cold, _ in rows:
        print(f"{n:6d} | " + "  ".join(f"{cold['breakdown'][k]:9.2f}" for k in BREAKDOWN))


def _print_targets(
    rows: list[FleetRow], from_redis: list[float], from_local: list[float], reps: int
) -> None:
    """The targets: excess, compiles, and a warm start from Redis vs from the local root."""
    unique = rows[0][1]["compiles"]
    base = rows[0][1]["wall"] - rows[0][2]["wall"]
    worst = max((c["wall"] - f["wall"]) / base for _, c, f in rows)
    same = all(c["compiles"] == unique for _, c, _ in rows)
    redis_s, local_s = statistics.median(from_redis), statistics.median(from_local)
    ratio = redis_s / local_s
    print(
        f"\nexcess (wall - warm floor) <= 1.3x N=1's for every N: {worst:.2f}x "
        f"{'PASS' if worst <= 1.3 else 'FAIL'}; fleet compiles == unique pieces ({unique}) "
        f"for every N: {'PASS' if same else 'FAIL'}"
    )
    print(
        f"warm start from Redis, empty root: {redis_s:.3f} s vs from the local root "
        f"{local_s:.3f} s (first call, median of {reps}): {ratio:.2f}x "
        f"{'PASS' if ratio <= 1.2 else 'FAIL'} (target <= 1.2x)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=3, help="warm starts of each kind")
    p.add_argument("--hosts", default="1,2,4", help="the fleet sizes (the first is the base)")
    a = p.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="fxpiece-bench-fleet-") as tmp,
        private_server(Path(tmp)) as port,
    ):
        fleet = Fleet(Path(tmp), port, a.layers, a.dtype)
        print(
            f"bench_fleet: {os.cpu_count()} cpu(s), toy Llama {a.layers} layers {a.dtype}, "
            f"redis on 127.0.0.1:{port}, host names {'distinct' if fleet.uts else 'shared'}",
            flush=True,
        )
        rows = _cold_and_floor(fleet, [int(x) for x in a.hosts.split(",")])
        from_redis, from_local = _warm_starts(fleet, rows[0][0], a.reps)
        _print_tables(rows)
        _print_targets(rows, from_redis, from_local, a.reps)


if __name__ == "__main__":
    main()
