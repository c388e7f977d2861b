"""One start of one peer, in this fresh process: the worker of
``bench_startup.py --only peers``. Prints one JSON line.

    python benches/startup_peers.py PEER cold|warm --work DIR [--layers 4 --hidden 256]

``cold`` prepares the peer's artifact (a compile, a capture, an export + an
AOTInductor build, a Mega-Cache dump) under ``DIR/PEER``; ``warm`` loads it
the way that peer's user would on a restart. Inductor's cache folder is
whatever ``TORCHINDUCTOR_CACHE_DIR`` says (the parent sets one per peer,
or a fresh empty one). The model is the demo's toy Llama (seeded), BF16,
24 token ids, the token dim dynamic where the peer's API allows it.

Timings: ``setup_s`` is ``compile()`` or the load (``torch.compile(...)``,
``fxpiece.compile(...)``, ``precompile.load``, ``aoti_load_package``, ...),
``first_call_s`` the first call; ``process_s`` runs from the parent's
spawn (``FXPIECE_BENCH_T0``, a ``time.monotonic()`` value: one clock for
every process of the host) to the first output. The eager reference the
output is checked against is computed *after* the first output, so it is
not in those figures.

The torch peers and the eager floor never import fxpiece: the toy model's
source (``python/fxpiece/toy_llama.py``) is loaded as a plain module of its
own, so the fxpiece package (and its ``__init__``) stays out. ``eager`` also
keeps ``torch._dynamo`` out; the JSON line says whether it did.
"""

from __future__ import annotations

import time

T_MAIN = time.monotonic()

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TOY_SRC = REPO / "python" / "fxpiece" / "toy_llama.py"
TOY_MODULE = "fxpiece_bench_toy_llama"
TOKENS = 24
MAX_TOKENS = 256

PEERS = (
    "eager",
    "eager-op",
    "fxpiece",
    "fxpiece-noaot",
    "stock",
    "megacache",
    "precompile",
    "aot_compile",
    "standalone",
    "aoti",
)


class Skip(Exception):
    """This peer cannot run on the installed torch: the reason."""


def _toy_module(fxpiece_peer: bool) -> Any:
    if fxpiece_peer:
        import fxpiece.toy_llama

        return fxpiece.toy_llama
    # Loaded from its file: ``import fxpiece.toy_llama`` would run the
    # package's __init__ (fxpiece's native module, its cache index ...).
    spec = importlib.util.spec_from_file_location(TOY_MODULE, TOY_SRC)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[TOY_MODULE] = mod  # dataclasses and pickles look it up by name
    spec.loader.exec_module(mod)
    return mod


def build_model(layers: int, hidden: int, fxpiece_peer: bool, sdpa: bool = False) -> Any:
    """fxpiece.demo.demo_model's few lines (copied: the torch peers must not
    import fxpiece). ``sdpa``: attention calls ``scaled_dot_product_attention``
    itself instead of through the custom op (the same computation, the same
    weights)."""
    import torch

    toy = sys.modules.get(TOY_MODULE) or _toy_module(fxpiece_peer)
    torch.manual_seed(0)
    cfg = toy.ToyLlamaConfig(
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_heads=max(1, hidden // 32),
        sdpa=sdpa,
    )
    return toy.ToyLlama(cfg).eval().to(torch.bfloat16)


def _mark_tokens(ids: Any) -> None:
    """The token dim unbacked, as fxpiece marks it (and demo.py's stock mode)."""
    from torch._dynamo.decorators import mark_unbacked

    mark_unbacked(ids, 0)


# Each peer: (phase, model, ids, folder) -> the callable whose first call is
# the first output. ``cold`` builds the artifact in ``folder`` (and may run
# the model doing so); ``warm`` only loads it.


def peer_eager(phase: str, model: Any, ids: Any, folder: Path) -> Callable[[Any], Any]:
    return model  # type: ignore[no-any-return]


def peer_fxpiece(aot: bool) -> Callable[..., Callable[[Any], Any]]:
    def start(phase: str, model: Any, ids: Any, folder: Path) -> Callable[[Any], Any]:
        import fxpiece
        from fxpiece.demo import demo_config

        # Both fxpiece modes share one cache root (the cold step is fxpiece's).
        root = folder.parent / "fxpiece" / "cache"
        return fxpiece.compile(model, demo_config(str(root), MAX_TOKENS, aot=aot))

    return start


def peer_stock(phase: str, model: Any, ids: Any, folder: Path) -> Callable[[Any], Any]:
    import torch

    compiled: Any = torch.compile(model, backend="inductor")

    def call(x: Any) -> Any:
        _mark_tokens(x)
        return compiled(x)

    return call


def peer_megacache(phase: str, model: Any, ids: Any, folder: Path) -> Callable[[Any], Any]:
    import torch

    blob = folder / "mega_cache.bin"
    if phase == "warm":
        torch.compiler.load_cache_artifacts(blob.read_bytes())
    compiled: Any = torch.compile(model, backend="inductor")

    def call(x: Any) -> Any:
        _mark_tokens(x)
        out = compiled(x)
        if phase == "cold":
            saved = torch.compiler.save_cache_artifacts()
            if saved is None:
                raise Skip("save_cache_artifacts() returned None (nothing recorded)")
            blob.write_bytes(saved[0])
        return out

    return call


def peer_precompile(phase: str, model: Any, ids: Any, folder: Path) -> Callable[[Any], Any]:
    import torch

    pc = getattr(torch.compiler, "precompile", None)
    if pc is None or not hasattr(pc, "capture"):
        raise Skip("torch.compiler.precompile is not in this torch")
    art, cache = folder / "model_precompile.py", folder / "model_precompile.cache"
    if phase == "cold":

        def capture(x: Any) -> Any:
            _mark_tokens(x)
            with pc.capture(lambda m, t: m(t), artifact_path=art, cache_path=cache) as cap:
                return cap(model, x)

        return capture
    loaded = pc.load(art, cache)
    return lambda x: loaded(model, x)


def peer_aot_compile(phase: str, model: Any, ids: Any, folder: Path) -> Callable[[Any], Any]:
    import torch

    path = folder / "aot_compiled.bin"
    if phase == "cold":
        import torch._dynamo

        torch._dynamo.config.enable_aot_compile = True

        def build(x: Any) -> Any:
            _mark_tokens(x)
            tc: Any = torch.compile(model.forward, fullgraph=True)
            fn = tc.aot_compile(((x,), {}))
            fn.save_compiled_function(str(path))
            return fn(model, x)  # the bound method's self is an argument

        return build
    with open(path, "rb") as f:
        fn = torch.compiler.load_compiled_function(f)
    return lambda x: fn(model, x)


def _param_names(model: Any) -> dict[int, str]:
    names = {id(p): f"p:{n}" for n, p in model.named_parameters()}
    names.update({id(b): f"b:{n}" for n, b in model.named_buffers()})
    return names


def peer_standalone(phase: str, model: Any, ids: Any, folder: Path) -> Callable[[Any], Any]:
    """``standalone_compile`` of the Dynamo graph (its inputs: the model's
    parameters and the ids); the warm start calls the loaded artifact with
    them in the order the cold step recorded."""
    import torch
    from torch._inductor import standalone_compile
    from torch._inductor.standalone_compile import CompiledArtifact

    art, order_file = folder / "standalone.bin", folder / "standalone_inputs.json"
    if phase == "cold":
        names = _param_names(model)

        def backend(gm: Any, example_inputs: list[Any]) -> Any:
            # Parameters by name, the ids, the token count (a SymInt).
            order = [
                names.get(id(t), "ids")
                if isinstance(t, torch.Tensor)
                else "tokens"
                if isinstance(t, torch.SymInt)
                else None
                for t in example_inputs
            ]
            if None in order or order.count("ids") != 1:
                raise Skip(f"unexpected Dynamo graph inputs: {order}")
            compiled = standalone_compile(gm, example_inputs, dynamic_shapes="from_graph")
            compiled.save(path=str(art), format="binary")
            order_file.write_text(json.dumps(order))
            return compiled

        c: Any = torch.compile(model, backend=backend, fullgraph=True)

        def cold_call(x: Any) -> Any:
            _mark_tokens(x)
            return c(x)

        return cold_call
    loaded = CompiledArtifact.load(path=str(art), format="binary")
    params = {f"p:{n}": p for n, p in model.named_parameters()}
    params.update({f"b:{n}": b for n, b in model.named_buffers()})
    order = json.loads(order_file.read_text())

    def call(x: Any) -> Any:
        args = {"ids": x, "tokens": x.shape[0]}
        out = loaded(*[args[k] if k in args else params[k] for k in order])
        return out[0] if isinstance(out, (tuple, list)) else out

    return call


def peer_aoti(phase: str, model: Any, ids: Any, folder: Path) -> Callable[[Any], Any]:
    import torch

    pkg = folder / "model.pt2"
    if phase == "cold":

        def build(x: Any) -> Any:
            tokens = torch.export.Dim("tokens", min=2, max=MAX_TOKENS)
            ep = torch.export.export(model, (x,), dynamic_shapes=({0: tokens},))
            torch._inductor.aoti_compile_and_package(ep, package_path=str(pkg))
            return torch._inductor.aoti_load_package(str(pkg))(x)

        return build
    return torch._inductor.aoti_load_package(str(pkg))


STARTS: dict[str, Callable[..., Callable[[Any], Any]]] = {
    "eager": peer_eager,
    "eager-op": peer_eager,
    "fxpiece": peer_fxpiece(aot=True),
    "fxpiece-noaot": peer_fxpiece(aot=False),
    "stock": peer_stock,
    "megacache": peer_megacache,
    "precompile": peer_precompile,
    "aot_compile": peer_aot_compile,
    "standalone": peer_standalone,
    "aoti": peer_aoti,
}


def run(peer: str, phase: str, work: Path, layers: int, hidden: int) -> dict[str, Any]:
    t_spawn = float(os.environ.get("FXPIECE_BENCH_T0", T_MAIN))
    out: dict[str, Any] = {"peer": peer, "phase": phase}
    import torch

    torch.set_grad_enabled(False)
    # The floor: the model with attention through SDPA directly. Through the
    # custom op, the op's first call imports torch._dynamo (torch.library
    # wraps every custom op's kernel in torch._disable_dynamo): "eager-op".
    model = build_model(layers, hidden, peer.startswith("fxpiece"), sdpa=peer == "eager")
    ids = torch.arange(TOKENS) % model.cfg.vocab_size
    out["import_s"] = time.monotonic() - t_spawn
    folder = work / peer
    folder.mkdir(parents=True, exist_ok=True)
    t_setup = time.monotonic()
    fn = STARTS[peer](phase, model, ids, folder)
    t0 = time.monotonic()
    got = fn(ids)
    t1 = time.monotonic()
    out.update(setup_s=t0 - t_setup, first_call_s=t1 - t0, process_s=t1 - t_spawn)
    out["python_start_s"] = T_MAIN - t_spawn
    out["dynamo_imported"] = "torch._dynamo" in sys.modules
    out["inductor_imported"] = "torch._inductor" in sys.modules
    out["fxpiece_imported"] = "fxpiece" in sys.modules
    out["compile_fx_imported"] = "torch._inductor.compile_fx" in sys.modules
    ref = (build_model(layers, hidden, False) if peer == "eager" else model)(ids)
    out["max_abs_diff"] = (got.float() - ref.float()).abs().max().item()
    out["scale"] = ref.float().abs().max().item()
    if peer.startswith("fxpiece"):
        c = fn.stats.counters.snapshot()  # type: ignore[attr-defined]
        out["inductor_compiles"] = c["num_inductor_compiles"]
        out["start"] = fn.start.path if fn.start else None  # type: ignore[attr-defined]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("peer", choices=PEERS)
    p.add_argument("phase", choices=["cold", "warm"])
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    a = p.parse_args()
    try:
        res = run(a.peer, a.phase, a.work, a.layers, a.hidden)
    except Skip as e:
        res = {"peer": a.peer, "phase": a.phase, "skip": str(e)}
    except Exception as e:  # a peer that fails on this torch is reported, not fatal
        traceback.print_exc()
        msg = str(e).strip().splitlines()
        res = {
            "peer": a.peer,
            "phase": a.phase,
            "skip": f"{type(e).__name__}: {msg[0] if msg else ''}",
        }
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
