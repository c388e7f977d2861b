"""One start of one peer serving Hugging Face ``generate()``, in this fresh
process: the worker of ``bench_startup.py --only peers-hf``. Prints one JSON
line with the fields of benches/startup_peers.py.

    python benches/hf_peers.py PEER cold|warm --work DIR

The model is examples/hf_generate.py's (``LlamaForCausalLM``, 2 layers,
hidden 64, seeded), a 7-token prompt, 4 new tokens, greedy. The first
output is the first ``generate()``: three Dynamo graphs (prefill, decode,
and the decode after the KV cache grows). Only the peers that can serve a
``generate()`` loop run: eager (the floor), stock ``torch.compile`` of
``model.forward`` with warm caches, Mega-Cache, fxpiece (AOT start and
``aot=False``). ``precompile``, ``aot_compile``, ``standalone_compile`` and
AOTInductor compile one graph of one call signature (no graph breaks, no
guards to pick among graphs), so they are not run: the parent says why.

Timings as in startup_peers.py: ``setup_s`` the compile()/load call,
``first_call_s`` the first ``generate()``, ``process_s`` from the parent's
spawn (``FXPIECE_BENCH_T0``, ``time.monotonic()``) to its end. The eager
tokens the output is checked against are computed after that.
"""

from __future__ import annotations

import time

T_MAIN = time.monotonic()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

PEERS = ("eager", "fxpiece", "fxpiece-noaot", "stock", "megacache")
UNSERVED = {
    "precompile": "compiles one graph of one call; generate() needs three graphs picked by guards",
    "aot_compile": "compiles one graph of one call; generate() needs three graphs picked by guards",
    "standalone": "compiles one FX graph; generate() needs Dynamo to capture and pick graphs",
    "aoti": "exports one graph with no graph breaks; generate()'s KV cache loop is not exportable",
    "eager-op": "the toy model's custom attention op: not in an HF model",
}
"""The peers of the toy comparison that cannot serve ``generate()``, and why."""
NEW_TOKENS = 4
PROMPT = 7
MAX_TOKENS = 64


def build_model() -> tuple[Any, Any]:
    """examples/hf_generate.py's model and prompt (the same seed)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT))
    return model, ids


def _generate(model: Any) -> Callable[[Any], Any]:
    def call(ids: Any) -> Any:
        return model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)

    return call


def peer_eager(phase: str, model: Any, folder: Path) -> Callable[[Any], Any]:
    return _generate(model)


def peer_fxpiece(aot: bool) -> Callable[[str, Any, Path], Callable[[Any], Any]]:
    def start(phase: str, model: Any, folder: Path) -> Callable[[Any], Any]:
        import fxpiece

        config = fxpiece.CompileConfig(
            splitting_ops=["torch.nn.functional.scaled_dot_product_attention"],
            max_num_tokens=MAX_TOKENS,
            compile_sizes=[1],
            dynamic="backed",
            cache_dir=str(folder.parent / "fxpiece" / "cache"),  # both modes share it
            aot=aot,
        )
        compiled = fxpiece.compile(
            model.forward, config, dynamic_arg_dims={"input_ids": 1}, varying_dims={"cache": 2}
        )
        model.forward = compiled
        call = _generate(model)
        call.compiled = compiled  # type: ignore[attr-defined]
        return call

    return start


def peer_stock(phase: str, model: Any, folder: Path) -> Callable[[Any], Any]:
    import torch

    model.forward = torch.compile(model.forward, backend="inductor")
    return _generate(model)


def peer_megacache(phase: str, model: Any, folder: Path) -> Callable[[Any], Any]:
    import torch

    blob = folder / "mega_cache.bin"
    if phase == "warm":
        torch.compiler.load_cache_artifacts(blob.read_bytes())
    model.forward = torch.compile(model.forward, backend="inductor")
    gen = _generate(model)

    def call(ids: Any) -> Any:
        out = gen(ids)
        if phase == "cold":
            saved = torch.compiler.save_cache_artifacts()
            if saved is None:
                raise RuntimeError("save_cache_artifacts() returned None (nothing recorded)")
            blob.write_bytes(saved[0])
        return out

    return call


STARTS: dict[str, Callable[[str, Any, Path], Callable[[Any], Any]]] = {
    "eager": peer_eager,
    "fxpiece": peer_fxpiece(aot=True),
    "fxpiece-noaot": peer_fxpiece(aot=False),
    "stock": peer_stock,
    "megacache": peer_megacache,
}


def run(peer: str, phase: str, work: Path) -> dict[str, Any]:
    t_spawn = float(os.environ.get("FXPIECE_BENCH_T0", T_MAIN))
    out: dict[str, Any] = {"peer": peer, "phase": phase}
    import torch

    torch.set_grad_enabled(False)
    model, ids = build_model()
    out["import_s"] = time.monotonic() - t_spawn
    folder = work / peer
    folder.mkdir(parents=True, exist_ok=True)
    t_setup = time.monotonic()
    fn = STARTS[peer](phase, model, folder)
    t0 = time.monotonic()
    got = fn(ids)
    t1 = time.monotonic()
    out.update(setup_s=t0 - t_setup, first_call_s=t1 - t0, process_s=t1 - t_spawn)
    out["python_start_s"] = T_MAIN - t_spawn
    out["dynamo_imported"] = "torch._dynamo" in sys.modules
    out["inductor_imported"] = "torch._inductor" in sys.modules
    out["fxpiece_imported"] = "fxpiece" in sys.modules
    out["compile_fx_imported"] = "torch._inductor.compile_fx" in sys.modules
    ref_model, _ = build_model()
    ref = _generate(ref_model)(ids)
    # Tokens: equal, or "wrong" by any measure the parent applies.
    out["max_abs_diff"] = 0.0 if torch.equal(got, ref) else float("inf")
    out["scale"] = 1.0
    compiled = getattr(fn, "compiled", None)
    if compiled is not None:
        out["inductor_compiles"] = compiled.stats.counters.snapshot()["num_inductor_compiles"]
        out["start"] = compiled.start.path if compiled.start else None
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("peer", choices=PEERS)
    p.add_argument("phase", choices=["cold", "warm"])
    p.add_argument("--work", required=True, type=Path)
    a = p.parse_args()
    try:
        res = run(a.peer, a.phase, a.work)
    except Exception as e:  # a peer that fails on this torch is reported, not fatal
        traceback.print_exc()
        msg = str(e).strip().splitlines()
        res = {"peer": a.peer, "phase": a.phase, "skip": f"{type(e).__name__}: {msg[:1]}"}
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
