"""The main job: compile a toy Llama piecewise (BF16, split at attention),
check it against eager, warm-start it in a second process, print a table.

Each phase runs in its own process (``python -m fxpiece.demo worker ...``)
so the warm start is a real fresh start: nothing is shared but the cache
folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fxpiece.toy_llama import ToyLlama

__all__ = ["demo_config", "demo_model", "main", "run_json", "run_phase", "worker"]

SPLIT_OP = "fxpiece_toy::attention"


def demo_config(cache_dir: str, max_tokens: int, aot: bool = True) -> Any:
    from fxpiece.config import CompileConfig

    return CompileConfig(
        splitting_ops=[SPLIT_OP],
        compile_ranges_endpoints=[16],
        max_num_tokens=max_tokens,
        compile_sizes=[8],
        cache_dir=cache_dir,
        aot=aot,
    )


def demo_model(layers: int, hidden: int, dtype: str) -> ToyLlama:
    """The demo's toy Llama (seeded: every process gets the same weights)."""
    import torch

    from fxpiece.toy_llama import ToyLlama, ToyLlamaConfig

    torch.manual_seed(0)
    cfg = ToyLlamaConfig(
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_heads=max(1, hidden // 32),
    )
    return ToyLlama(cfg).eval().to(getattr(torch, dtype))


def run_json(cmd: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` (a fresh process; its stderr passes through) and return
    the JSON object on the last line of its stdout, with ``process_s``, its
    wall time. A failed run exits naming ``what``."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        list(cmd), stdout=subprocess.PIPE, text=True, env=None if env is None else dict(env)
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode})")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - t0
    return result


def _latency(fn: Any, ids: Any, reps: int) -> float:
    import torch

    with torch.no_grad():
        for _ in range(3):
            fn(ids)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(ids)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _stock_inductor(
    model: ToyLlama, cache_dir: str, mark_token_dim: Callable[[Any, int], None]
) -> Callable[[Any], Any]:
    """``model`` under stock ``torch.compile`` (Inductor, its cache under
    ``cache_dir``), the token dimension of each input marked dynamic."""
    import torch

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "stock-inductor")
    stock = torch.compile(model, backend="inductor")

    def compiled(x: Any) -> Any:
        mark_token_dim(x, 0)
        return stock(x)

    return compiled


def _fxpiece_figures(compiled: Any, first_call_s: float) -> dict[str, Any]:
    """What an ``fxpiece.compile``-d model's stats say about its first call."""
    stats = compiled.stats
    c = stats.counters.snapshot()
    g = stats.graphs[0]
    return dict(
        backend_s=stats.total_s,
        compile_s=stats.compile_s,
        load_s=stats.load_s,
        dynamo_s=first_call_s - stats.total_s,
        pieces=g.num_pieces,
        compiled_pieces=g.num_compiled_pieces,
        entries=[str(r) for r in compiled.backend.config.compile_entries],
        counters=c,
        start=compiled.start.path if compiled.start else None,
    )


def worker(
    mode: str,
    cache_dir: str,
    layers: int,
    hidden: int,
    dtype: str,
    max_tokens: int,
    latency_sizes: Sequence[int],
    reps: int,
    threads: int | None = None,
) -> dict[str, Any]:
    """One phase in this process; returns what it measured (``threads``:
    ``torch.set_num_threads`` first, before anything is compiled, as a
    server would)."""
    t_import = time.perf_counter()
    import torch

    if threads:
        torch.set_num_threads(threads)

    import fxpiece
    from fxpiece.piecewise import _torch_compat

    model = demo_model(layers, hidden, dtype)
    import_s = time.perf_counter() - t_import
    ids = torch.arange(24) % model.cfg.vocab_size
    with torch.no_grad():
        ref = model(ids)
    out: dict[str, Any] = {"mode": mode, "import_s": import_s}
    t_setup = time.perf_counter()
    if mode in ("fxpiece", "fxpiece-noaot"):
        compiled: Any = fxpiece.compile(
            model, demo_config(cache_dir, max_tokens, aot=mode == "fxpiece")
        )
        compiled.backend.progress = _progress
    elif mode == "inductor":
        compiled = _stock_inductor(model, cache_dir, _torch_compat.mark_token_dim)
    else:
        compiled = model
    t0 = time.perf_counter()
    # fxpiece.compile(...) or torch.compile(...) itself: both import
    # Inductor's compiler there, before the first call.
    out["setup_s"] = t0 - t_setup
    with torch.no_grad():
        got = compiled(ids)
    out["first_call_s"] = time.perf_counter() - t0
    diff = (got.float() - ref.float()).abs().max().item()
    out["max_abs_diff"] = diff
    out["scale"] = ref.float().abs().max().item()
    if mode in ("fxpiece", "fxpiece-noaot"):
        out.update(_fxpiece_figures(compiled, out["first_call_s"]))
    sizes = [(str(n), torch.arange(n) % model.cfg.vocab_size) for n in latency_sizes]
    out["latency_s"] = {n: _latency(compiled, ids, reps) for n, ids in sizes}
    out["threads"] = torch.get_num_threads()
    return out


def _progress(ev: Any) -> None:
    """A one-line progress bar on stderr: piece i/N, entry, action, seconds."""
    width = 20
    done = int(width * (ev.piece + 1) / ev.num_pieces)
    bar = "#" * done + "." * (width - done)
    sys.stderr.write(
        f"\r  [{bar}] piece {ev.piece + 1}/{ev.num_pieces} entry {ev.entry!s:<10} "
        f"{ev.action:<8} {ev.seconds:6.2f} s "
    )
    sys.stderr.flush()


def run_phase(mode: str, cache_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run :func:`worker` in a fresh Python process and return its result."""
    cmd = [
        sys.executable,
        "-m",
        "fxpiece.demo",
        "worker",
        mode,
        "--cache-dir",
        cache_dir,
        "--layers",
        str(args.layers),
        "--hidden",
        str(args.hidden),
        "--dtype",
        args.dtype,
        "--max-tokens",
        str(args.max_tokens),
        "--reps",
        str(args.reps),
        "--latency-sizes",
        ",".join(str(s) for s in args.latency_sizes),
        *(["--threads", str(args.threads)] if getattr(args, "threads", None) else []),
    ]
    # stderr passes through: the worker's progress bar shows live.
    result = run_json(cmd, f"demo: the {mode} phase")
    sys.stderr.write("\n")
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fxpiece demo", description=__doc__)
    p.add_argument("--cache-dir", help="cache root (default: a fresh temporary folder)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument(
        "--latency-sizes",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[1, 16, 128],
    )
    p.add_argument("--threads", type=int, help="torch.set_num_threads before compiling")
    return p


def _row(cells: Sequence[Any], widths: Sequence[int]) -> str:
    return "  ".join(
        str(c).ljust(w) if i == 0 else str(c).rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def _worker_main(argv: Sequence[str]) -> int:
    """``python -m fxpiece.demo worker MODE ...``: one phase, its result as
    one JSON line on stdout."""
    p = _parser()
    p.add_argument("mode", choices=["fxpiece", "fxpiece-noaot", "inductor", "eager"])
    a = p.parse_args(argv)
    res = worker(
        a.mode,
        a.cache_dir,
        a.layers,
        a.hidden,
        a.dtype,
        a.max_tokens,
        a.latency_sizes,
        a.reps,
        a.threads,
    )
    print(json.dumps(res))
    return 0


def _print_starts(cold: Mapping[str, Any], warm: Mapping[str, Any]) -> None:
    """The pieces, then the cold and warm starts side by side."""
    w = [28, 12, 12]
    print(
        f"pieces: {cold['pieces']} ({cold['compiled_pieces']} compiled, "
        f"{cold['pieces'] - cold['compiled_pieces']} split ops run eagerly); "
        f"entries per piece: {', '.join(cold['entries'])}"
    )
    print(_row(["", "cold", "warm"], w))
    print(_row(["start path", cold["start"], warm["start"]], w))
    for label, key in [
        ("first call, total (s)", "first_call_s"),
        ("  Dynamo trace or AOT load (s)", "dynamo_s"),
        ("  backend (s)", "backend_s"),
        ("    compile (s)", "compile_s"),
        ("    load from cache (s)", "load_s"),
    ]:
        print(_row([label, f"{cold[key]:.2f}", f"{warm[key]:.2f}"], w))
    for label, key in [
        ("Inductor compiles", "num_inductor_compiles"),
        ("cache hits", "num_cache_hits"),
        ("backend compilations", "num_backend_compilations"),
    ]:
        print(_row([label, cold["counters"][key], warm["counters"][key]], w))
    print(
        _row(["max |out - eager|", f"{cold['max_abs_diff']:.3g}", f"{warm['max_abs_diff']:.3g}"], w)
    )


def _print_latency(warm: Mapping[str, Any], eager: Mapping[str, Any]) -> None:
    """Latency per token count: eager vs the warm-started fxpiece model."""
    w = [10, 12, 12, 14]
    print(_row(["tokens", "eager (ms)", "fxpiece (ms)", "speed vs eager"], w))
    for n, t in warm["latency_s"].items():
        e = eager["latency_s"][n]
        print(_row([n, f"{e * 1e3:.3f}", f"{t * 1e3:.3f}", f"{e / t:.2f}x"], w))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        return _worker_main(argv[1:])
    a = _parser().parse_args(argv)
    cache_dir = a.cache_dir or tempfile.mkdtemp(prefix="fxpiece-demo-")
    print(
        f"fxpiece demo: toy Llama, {a.layers} layers, hidden {a.hidden}, {a.dtype}, "
        f"split at {SPLIT_OP}; cache {cache_dir}"
    )
    print("cold start (empty cache) ...", flush=True)
    cold = run_phase("fxpiece", cache_dir, a)
    print("warm start (fresh process, same cache) ...", flush=True)
    warm = run_phase("fxpiece", cache_dir, a)
    eager = run_phase("eager", cache_dir, a)
    tol = 0.05 if a.dtype == "bfloat16" else 1e-3
    ok = all(r["max_abs_diff"] <= tol * max(1.0, r["scale"]) for r in (cold, warm))
    print()
    _print_starts(cold, warm)
    print()
    _print_latency(warm, eager)
    print()
    print("outputs match eager" if ok else "OUTPUTS DO NOT MATCH EAGER")
    return 0 if ok and warm["counters"]["num_inductor_compiles"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
