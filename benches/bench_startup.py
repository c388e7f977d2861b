"""Startup and steady-state benchmark of the piecewise backend.

Prints, in one run (every phase a fresh process on one cache folder), for
the toy Llama (4 layers, hidden 256, BF16) and a larger one (8 layers,
hidden 1024, BF16):
- cold vs warm backend time (target: warm <= 10% of cold);
- the warm first call with the ahead-of-time start (Dynamo's saved output
  loaded, no trace) and without it (``aot=False``: Dynamo traces), each vs
  stock ``torch.compile(backend="inductor")`` warm (target: <= 0.6x), and
  the whole warm process to the first output vs stock: medians of
  ``--starts`` fresh processes per mode, the modes interleaved;
- steady-state latency at 1, 16 and 256 tokens vs whole-graph Inductor,
  with all threads and with ``torch.set_num_threads(1)`` (target: <=
  1.05x), measured by benches/steady_state.py: the three in one process,
  interleaved;
- Hugging Face ``generate()`` (examples/hf_generate.py: a 2-layer Llama,
  7-token prompt, 4 new tokens; three Dynamo graphs, all captured ahead of
  time): the first ``generate`` cold and warm (median of ``--starts``
  processes) vs stock ``torch.compile`` (target: warm <= 0.6x), and a
  second ``generate`` (steady state);
- ``--only peers`` (or ``peers-large``, or ``peers-hf``: HF ``generate()``,
  benches/hf_peers.py, with the torch paths that can serve it): the warm start of fxpiece against
  every warm path torch itself offers (issue 25): stock ``torch.compile``
  with warm caches, ``torch.compiler.precompile``, ``aot_compile`` +
  ``load_compiled_function``, ``standalone_compile`` +
  ``CompiledArtifact.load``, AOTInductor (``aoti_load_package``), Mega-Cache
  (``load_cache_artifacts`` before ``torch.compile``) and eager (the floor),
  each a fresh process (benches/startup_peers.py), with Inductor's folder
  warm and with it empty; ``compile()``/load + first output and the whole
  process to the first output, as ratios to fxpiece's (median of
  ``--starts``, default 3; peers interleaved).

    python benches/bench_startup.py [--only toy|large|hf|peers|peers-large|peers-hf] [--reps 100]
        [--starts 5] [--peers fxpiece,aoti,eager] [--folders warm,empty]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import hf_peers

from fxpiece.demo import run_json, run_phase

MODELS = {
    "toy": {"layers": 4, "hidden": 256},
    "large": {"layers": 8, "hidden": 1024},
}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def bench_model(name: str, layers: int, hidden: int, a: argparse.Namespace) -> None:
    # Phases stop after the first call; steady state is measured apart.
    args = argparse.Namespace(
        layers=layers,
        hidden=hidden,
        dtype="bfloat16",
        max_tokens=256,
        reps=0,
        latency_sizes=[],
    )
    d = tempfile.mkdtemp(prefix=f"fxpiece-bench-startup-{name}-")
    print(f"\n== {name}: Llama {layers} layers, hidden {hidden}, bfloat16; cache {d}", flush=True)
    cold = run_phase("fxpiece", d, args)
    warm = run_phase("fxpiece", d, args)
    stock_cold = run_phase("inductor", d, args)
    starts = _warm_starts(d, args, a.starts)
    _print_backend_time(cold, warm)
    _print_warm_first_call(starts, stock_cold, a.starts)
    _print_steady_state(d, layers, hidden, a.reps)
    print(f"max |out - eager|: cold {cold['max_abs_diff']:.3g}, warm {warm['max_abs_diff']:.3g}")


def _warm_starts(folder: str, args: argparse.Namespace, n: int) -> dict[str, list[dict[str, Any]]]:
    """``n`` warm processes of each mode (fxpiece, fxpiece aot=False, stock
    Inductor) on the cache ``folder``; each mode's results."""
    # Startup: warm processes, the modes interleaved (this VM's speed
    # drifts); the medians are compared.
    first = args
    starts: dict[str, list[dict[str, Any]]] = {"fxpiece": [], "fxpiece-noaot": [], "inductor": []}
    for _ in range(n):
        for mode, runs in starts.items():
            runs.append(run_phase(mode, folder, first))
    return starts


def _print_backend_time(cold: dict[str, Any], warm: dict[str, Any]) -> None:
    """The cold vs warm backend time line and its target."""
    r = warm["backend_s"] / cold["backend_s"]
    print(
        f"backend time: cold {cold['backend_s']:.2f} s ({cold['counters']['num_inductor_compiles']}"
        f" Inductor compiles), warm {warm['backend_s']:.2f} s "
        f"({warm['counters']['num_inductor_compiles']} compiles, "
        f"{warm['counters']['num_cache_hits']} hits) -> {r:.3f} (target <= 0.10) "
        f"{verdict(r <= 0.10)}"
    )


def _print_warm_first_call(
    starts: dict[str, list[dict[str, Any]]], stock_cold: dict[str, Any], n: int
) -> None:
    """The medians of the ``n`` warm starts of each mode: the first call with
    and without the ahead-of-time start vs stock, and the whole process."""
    warm_s, noaot_s, stock_s = (
        {k: median([ph[k] for ph in starts[m]]) for k in ("first_call_s", "setup_s", "process_s")}
        for m in starts
    )
    base = stock_s["first_call_s"]
    print(
        f"warm first call, median of {n} fresh processes each (stock torch.compile "
        f"warm: {base:.2f} s, cold {stock_cold['first_call_s']:.2f} s; compile() itself, "
        f"which imports Inductor's compiler in both: stock {stock_s['setup_s']:.2f} s):"
    )
    for label, ph, path in (
        ("ahead-of-time start", warm_s, starts["fxpiece"][-1]["start"]),
        ("aot=False (Dynamo traces)", noaot_s, starts["fxpiece-noaot"][-1]["start"]),
    ):
        q = ph["first_call_s"] / base
        both = (ph["setup_s"] + ph["first_call_s"]) / (stock_s["setup_s"] + base)
        # The target is the ahead-of-time start's; aot=False is for reference.
        target = f" (target <= 0.6) {verdict(q <= 0.6)}" if path == "aot-load" else ""
        print(
            f"  {label:<27} {ph['first_call_s']:.2f} s  start={path}  -> {q:.2f}x{target}; "
            f"with compile() {ph['setup_s'] + ph['first_call_s']:.2f} s -> {both:.2f}x"
        )
    print(
        f"  whole warm process to the first output, imports included: fxpiece "
        f"{warm_s['process_s']:.2f} s, aot=False {noaot_s['process_s']:.2f} s, stock "
        f"{stock_s['process_s']:.2f} s -> {warm_s['process_s'] / stock_s['process_s']:.2f}x"
    )


def _print_steady_state(folder: str, layers: int, hidden: int, reps: int) -> None:
    """Steady-state latency (:func:`steady_state`) with all threads, then with
    one: a table each, fxpiece vs whole-graph Inductor and its target."""
    for label, threads in (("all threads", None), ("1 thread", 1)):
        lat = steady_state(folder, layers, hidden, threads, reps)
        print(f"steady state, {label} (one process, interleaved; median of {reps} calls each)")
        print(
            f"  {'tokens':>6}  {'eager ms':>9}  {'inductor ms':>11}  {'fxpiece ms':>10}  "
            f"{'vs inductor':>11}"
        )
        for n, t in lat.items():
            f, i, e = t["fxpiece"], t["inductor"], t["eager"]
            print(
                f"  {n:>6}  {e * 1e3:9.3f}  {i * 1e3:11.3f}  {f * 1e3:10.3f}  {f / i:10.2f}x "
                f"{verdict(f / i <= 1.05)}"
            )


HF_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "hf_generate.py"
STEADY = Path(__file__).resolve().parent / "steady_state.py"


def steady_state(
    folder: str, layers: int, hidden: int, threads: int | None, reps: int
) -> dict[str, dict[str, float]]:
    """benches/steady_state.py in a fresh process (``threads`` set before
    anything is compiled, as a server would)."""
    cmd = [sys.executable, str(STEADY), "--cache-dir", folder, "--layers", str(layers)]
    cmd += ["--hidden", str(hidden), "--reps", str(reps)]
    cmd += ["--threads", str(threads)] if threads else []
    result = run_json(cmd, "bench: steady_state.py")
    result.pop("process_s")
    return result


def hf_phase(backend: str, folder: str) -> dict[str, Any]:
    """One fresh process running examples/hf_generate.py; ``folder`` holds
    fxpiece's cache or (stock) Inductor's cache."""
    env = dict(os.environ)
    cmd = [sys.executable, str(HF_EXAMPLE), "--new-tokens", "4", "--backend", backend]
    if backend == "stock":
        env["TORCHINDUCTOR_CACHE_DIR"] = folder
    else:
        cmd += ["--cache", folder]
    return run_json(cmd, f"bench: hf_generate --backend {backend}", env)


def bench_hf(starts: int) -> None:
    fx_dir = tempfile.mkdtemp(prefix="fxpiece-bench-hf-")
    stock_dir = tempfile.mkdtemp(prefix="fxpiece-bench-hf-inductor-")
    print("\n== hf: LlamaForCausalLM 2 layers, hidden 64, generate() 7 + 4 tokens", flush=True)
    cold, s_cold = hf_phase("fxpiece", fx_dir), hf_phase("stock", stock_dir)
    # Warm: fresh processes, the two interleaved; the medians are compared.
    runs: dict[str, list[dict[str, Any]]] = {"fxpiece": [], "stock": []}
    for _ in range(starts):
        runs["fxpiece"].append(hf_phase("fxpiece", fx_dir))
        runs["stock"].append(hf_phase("stock", stock_dir))
    warm, s_warm = ({**r[-1], **_medians(r)} for r in runs.values())
    ok = all(r["tokens_equal_eager"] for r in (cold, s_cold, *runs["fxpiece"], *runs["stock"]))
    print(f"warm: median of {starts} fresh processes each")
    print(
        f"graphs: fxpiece {cold['graphs']}, stock {s_cold['graphs']}; fxpiece Inductor "
        f"compiles cold {cold['inductor_compiles']}, warm {warm['inductor_compiles']}; "
        f"start cold {cold['start']} ({cold['aot_saves']} entries), warm {warm['start']} "
        f"({warm['aot_loads']} entries, {warm['aot_fallbacks']} calls traced); "
        f"tokens equal eager: {ok}"
    )
    for label, ours, base in (("cold", cold, s_cold), ("warm", warm, s_warm)):
        q = ours["seconds"] / base["seconds"]
        target = f"(target <= 0.6) {verdict(q <= 0.6)}" if label == "warm" else ""
        both = (ours["seconds"] + ours["setup_seconds"]) / (base["seconds"] + base["setup_seconds"])
        print(
            f"first generate {label}: fxpiece {ours['seconds']:.2f} s, stock "
            f"{base['seconds']:.2f} s -> {q:.2f}x {target}; with compile() {both:.2f}x; "
            f"whole process "
            f"{ours['process_s']:.2f} s vs {base['process_s']:.2f} s "
            f"-> {ours['process_s'] / base['process_s']:.2f}x"
        )
    st = warm["steady_seconds"] / s_warm["steady_seconds"]
    print(
        f"second generate (steady): fxpiece {warm['steady_seconds'] * 1e3:.2f} ms, stock "
        f"{s_warm['steady_seconds'] * 1e3:.2f} ms -> {st:.2f}x"
    )


# -- Peers: fxpiece's warm start against torch's own warm paths (issue 25) --

PEERS_WORKER = Path(__file__).resolve().parent / "startup_peers.py"
HF_WORKER = Path(__file__).resolve().parent / "hf_peers.py"
PEER_LABELS = {
    "fxpiece": "fxpiece AOT start",
    "fxpiece-noaot": "fxpiece aot=False (Dynamo traces)",
    "stock": "stock torch.compile, warm caches",
    "megacache": "Mega-Cache (load_cache_artifacts)",
    "precompile": "torch.compiler.precompile load",
    "aot_compile": "aot_compile + load_compiled_function",
    "standalone": "standalone_compile + CompiledArtifact.load",
    "aoti": "AOTInductor (aoti_load_package)",
    "eager-op": "eager, attention via the custom op",
    "eager": "eager (the floor)",
}
# The cold step that prepares each peer's artifact (fxpiece-noaot uses
# fxpiece's cache root; the eager ones have none).
PEER_COLD = {"fxpiece-noaot": "fxpiece", "eager": None, "eager-op": None}
BF16_TOL = 0.05


@dataclass(frozen=True)
class PeerModel:
    """The model a peers section starts: a toy-family Llama
    (benches/startup_peers.py) or, with ``hf``, the HF ``generate()`` one
    (benches/hf_peers.py, whose size is its own)."""

    name: str
    layers: int = 0
    hidden: int = 0
    hf: bool = False

    def command(self, peer: str, phase: str, work: Path) -> list[str]:
        worker = HF_WORKER if self.hf else PEERS_WORKER
        cmd = [sys.executable, str(worker), peer, phase, "--work", str(work)]
        if not self.hf:
            cmd += ["--layers", str(self.layers), "--hidden", str(self.hidden)]
        return cmd

    def describe(self) -> str:
        if self.hf:
            return (
                f"HF LlamaForCausalLM 2 layers, hidden 64, fp32, generate() "
                f"{hf_peers.PROMPT} + {hf_peers.NEW_TOKENS} tokens"
            )
        return f"Llama {self.layers} layers, hidden {self.hidden}, bfloat16, 24 tokens"


def peer_start(
    peer: str, phase: str, work: Path, inductor_dir: Path, model: PeerModel
) -> dict[str, Any]:
    """One fresh process of ``model``'s worker; its JSON line, or
    ``{"skip": reason}`` when it failed (its stderr is kept in a log)."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(inductor_dir))
    cmd = model.command(peer, phase, work)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    log = logs / f"{peer}-{phase}-{len(list(logs.iterdir()))}.log"
    with open(log, "w") as err:
        # The child measures from here: time.monotonic() is one clock for
        # every process of the host.
        env["FXPIECE_BENCH_T0"] = repr(time.monotonic())
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"peer": peer, "skip": f"worker exit {proc.returncode}; see {log}"}
    res: dict[str, Any] = json.loads(lines[-1])
    if "skip" in res:
        res["skip"] += f" (log: {log})"
    return res


def _out_ok(r: dict[str, Any]) -> bool:
    return bool(r["max_abs_diff"] <= BF16_TOL * max(1.0, r["scale"]))


def _cold_steps(
    peers: list[str],
    work: Path,
    warm_dir: dict[str, Path],
    model: PeerModel,
    skipped: dict[str, str],
) -> tuple[dict[str, str], list[str]]:
    """The cold / prepare step of each peer that has its own (Inductor's folder:
    the peer's warm one, still empty), a line printed each; ``skipped`` with
    the peers skipped since added, and the outputs out of tolerance."""
    skipped = dict(skipped)
    wrong: list[str] = []
    print("cold / prepare step (once per peer, Inductor's folder empty; not a warm start):")
    for p in peers:
        src = PEER_COLD.get(p, p)
        if src is None:
            continue
        if p in skipped:
            print(f"  {PEER_LABELS[p]:<44} SKIP: {skipped[p]}")
            continue
        if src != p:
            if src in skipped:
                skipped[p] = skipped[src]
            print(f"  {PEER_LABELS[p]:<44} uses {src}'s cold step")
            continue
        warm_dir[p].mkdir(parents=True, exist_ok=True)
        r = peer_start(p, "cold", work, warm_dir[p], model)
        if "skip" in r:
            skipped[p] = r["skip"]
            print(f"  {PEER_LABELS[p]:<44} SKIP: {r['skip']}")
            continue
        if not _out_ok(r):
            wrong.append(f"{p} cold: max |out - eager| {r['max_abs_diff']:.3g}")
        print(
            f"  {PEER_LABELS[p]:<44} compile()/prepare + first output "
            f"{r['setup_s'] + r['first_call_s']:7.2f} s, whole process {r['process_s']:7.2f} s, "
            f"max |out - eager| {r['max_abs_diff']:.3g}",
            flush=True,
        )
    return skipped, wrong


PeerRuns = dict[tuple[str, str], list[dict[str, Any]]]


def _warm_rounds(
    peers: list[str],
    folders: list[str],
    starts: int,
    work: Path,
    warm_dir: dict[str, Path],
    model: PeerModel,
    skipped: dict[str, str],
) -> tuple[PeerRuns, dict[str, str]]:
    """``starts`` rounds of one warm start of every peer not skipped in each of
    ``folders`` (Inductor's folder warm, or a fresh empty one); the results by
    (peer, folder), and ``skipped`` with the peers skipped since added."""
    skipped = dict(skipped)
    runs: PeerRuns = {}
    for i in range(starts):
        for folder in folders:
            for p in peers:
                if p in skipped:
                    continue
                if folder == "warm":
                    ind = warm_dir[p]
                    ind.mkdir(parents=True, exist_ok=True)
                else:  # a fresh empty folder for each start
                    ind = work / "inductor-empty" / f"{p}-{i}"
                    ind.mkdir(parents=True)
                r = peer_start(p, "warm", work, ind, model)
                if folder == "empty":
                    shutil.rmtree(ind, ignore_errors=True)
                if "skip" in r:
                    skipped[p] = r["skip"]
                    continue
                runs.setdefault((p, folder), []).append(r)
        print(f"  round {i + 1}/{starts} done", flush=True)
    return runs, skipped


def _folder_medians(
    peers: list[str], folder: str, runs: PeerRuns, skipped: dict[str, str], model: PeerModel
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Each started peer's medians over its warm starts in ``folder`` (and,
    for fxpiece's, its compiles); the outputs out of tolerance and the eager
    floor's unwanted imports."""
    med: dict[str, dict[str, float]] = {}
    wrong: list[str] = []
    for p in peers:
        rs = runs.get((p, folder))
        if p in skipped or not rs:
            continue
        med[p] = {k: median(r[k] for r in rs) for k in ("setup_s", "first_call_s", "process_s")}
        med[p]["both"] = median(r["setup_s"] + r["first_call_s"] for r in rs)
        med[p]["diff"] = max(r["max_abs_diff"] for r in rs)
        wrong += [
            f"{p} warm ({folder} folder): max |out - eager| {r['max_abs_diff']:.3g}"
            for r in rs
            if not _out_ok(r)
        ]
        if p == "eager" and any(r["fxpiece_imported"] for r in rs):
            wrong.append("eager (the floor) imported fxpiece")
        # (transformers imports Dynamo itself: only the toy floor is checked)
        if p == "eager" and not model.hf and any(r["dynamo_imported"] for r in rs):
            wrong.append("eager (the floor) imported torch._dynamo or fxpiece")
        if p.startswith("fxpiece"):
            med[p]["compiles"] = max(r["inductor_compiles"] for r in rs)
            med[p]["compile_fx"] = sum(r["compile_fx_imported"] for r in rs)
            med[p]["starts"] = len(rs)
    return med, wrong


def _print_folder_table(folder: str, starts: int, med: dict[str, dict[str, float]]) -> None:
    """One folder's table of warm starts, ratios to fxpiece's, and fxpiece's
    Inductor compiles."""
    print(
        f"\nwarm start, Inductor's folder {folder.upper()}"
        + (" (a fresh empty one for each start)" if folder == "empty" else "")
        + f": median of {starts} fresh processes each"
    )
    fx = med.get("fxpiece")
    print(
        f"  {'peer':<44} {'compile()/load':>14} {'first call':>10} "
        f"{'both':>7} {'vs fxpiece':>10} {'whole process':>13} {'vs fxpiece':>10} "
        f"{'max|diff|':>9}"
    )
    for p, m in med.items():
        vs = f"{m['both'] / fx['both']:.2f}x" if fx else "-"
        vs_p = f"{m['process_s'] / fx['process_s']:.2f}x" if fx else "-"
        print(
            f"  {PEER_LABELS[p]:<44} {m['setup_s']:12.2f} s {m['first_call_s']:8.2f} s "
            f"{m['both']:5.2f} s {vs:>10} {m['process_s']:11.2f} s {vs_p:>10} "
            f"{m['diff']:9.3g}"
        )
    for p in ("fxpiece", "fxpiece-noaot"):
        if p in med:
            m = med[p]
            print(
                f"  {p}: Inductor compiles on a warm start {m['compiles']:.0f} (at most); "
                f"Inductor's compile_fx imported by the first output in "
                f"{m['compile_fx']:.0f} of {m['starts']:.0f} starts"
            )


def _print_peer_targets(med: dict[str, dict[str, float]], model: PeerModel) -> None:
    """One folder's target lines: fxpiece vs the best torch path that can serve
    ``generate()`` (HF model), vs AOTInductor, and vs eager's whole process."""
    fx = med.get("fxpiece")
    aoti, eager = med.get("aoti"), med.get("eager")
    if fx and model.hf:
        best = min((m["both"], p) for p, m in med.items() if p in ("stock", "megacache"))
        q = fx["both"] / best[0]
        print(
            f"  AOTInductor cannot serve generate(); fxpiece compile() + first output vs "
            f"the best torch path that can ({PEER_LABELS[best[1]]}): "
            f"{fx['both']:.2f} vs {best[0]:.2f} s -> {q:.2f}x {verdict(q <= 1.0)}"
        )
    if fx and aoti:
        q = fx["both"] / aoti["both"]
        print(
            f"  target: fxpiece compile() + first output <= AOTInductor's: "
            f"{fx['both']:.2f} vs {aoti['both']:.2f} s -> {q:.2f}x {verdict(q <= 1.0)}"
        )
    if fx and eager:
        q = fx["process_s"] / eager["process_s"]
        print(
            f"  target: fxpiece whole warm process <= 1.15x eager's: "
            f"{fx['process_s']:.2f} vs {eager['process_s']:.2f} s -> {q:.2f}x "
            f"{verdict(q <= 1.15)}"
        )


def bench_peers(model: PeerModel, a: argparse.Namespace) -> None:
    starts = a.starts or 3
    peers = [p for p in PEER_LABELS if a.peers is None or p in a.peers]
    work = Path(tempfile.mkdtemp(prefix=f"fxpiece-bench-peers-{model.name}-"))
    print(
        f"\n== peers, {model.name}: {model.describe()}; fresh processes; work folder {work}",
        flush=True,
    )
    warm_dir = {p: work / "inductor" / p for p in peers}
    # The peers that cannot serve generate() are not started (the reason is printed).
    skipped = {p: why for p, why in hf_peers.UNSERVED.items() if model.hf and p in peers}
    skipped, wrong = _cold_steps(peers, work, warm_dir, model, skipped)
    folders = [f for f in ("warm", "empty") if f in a.folders]
    runs, skipped = _warm_rounds(peers, folders, starts, work, warm_dir, model, skipped)
    raw = work / "peers.json"
    raw.write_text(json.dumps({f"{p} {f}": rs for (p, f), rs in runs.items()}, indent=1))
    print(f"every start's figures: {raw}")
    for p, why in skipped.items():
        print(f"SKIP {PEER_LABELS[p]}: {why}")
    for folder in folders:
        med, folder_wrong = _folder_medians(peers, folder, runs, skipped, model)
        wrong += folder_wrong
        _print_folder_table(folder, starts, med)
        _print_peer_targets(med, model)
    if wrong:
        raise SystemExit("PEER OUTPUTS WRONG (vs eager, BF16 tolerance):\n  " + "\n  ".join(wrong))
    if model.hf:
        print("outputs: every peer's generate() tokens equal eager's")
    else:
        print(f"outputs: every peer equals eager within BF16 tolerance ({BF16_TOL} x max |out|)")


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("seconds", "setup_seconds", "process_s", "steady_seconds")
    return {k: median(r[k] for r in runs) for k in keys}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--only",
        choices=[*sorted(MODELS), "hf", "peers", "peers-large", "peers-hf"],
        help="one section (default: toy, large, hf, then peers on the toy)",
    )
    p.add_argument("--reps", type=int, default=100, help="timed calls per size and mode")
    p.add_argument(
        "--starts",
        type=int,
        help="warm processes per mode for the startup medians (default 5; peers: 3)",
    )
    p.add_argument(
        "--peers",
        type=lambda s: s.split(","),
        help=f"peers section: only these (of {','.join(PEER_LABELS)})",
    )
    p.add_argument(
        "--folders",
        type=lambda s: s.split(","),
        default=["warm", "empty"],
        help="peers section: Inductor's folder warm, empty or both (default warm,empty)",
    )
    a = p.parse_args()
    starts = a.starts
    a.starts = starts or 5
    for name, spec in MODELS.items():
        if a.only in (None, name):
            bench_model(name, spec["layers"], spec["hidden"], a)
    if a.only in (None, "hf"):
        bench_hf(a.starts)
    a.starts = starts
    for name, section in (("toy", "peers"), ("large", "peers-large")):
        if a.only == section or (a.only is None and section == "peers"):
            bench_peers(PeerModel(name, MODELS[name]["layers"], MODELS[name]["hidden"]), a)
    if a.only == "peers-hf":
        bench_peers(PeerModel("hf", hf=True), a)


if __name__ == "__main__":
    main()
