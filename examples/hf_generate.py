"""Hugging Face ``generate()`` compiled piecewise with fxpiece.

A small Llama built from a config (random weights, no download), SDPA
attention as the split op. Run it twice: the first run compiles every
unique piece of every Dynamo graph ``generate`` produces, the second (a
fresh process) loads them all and compiles nothing::

    python examples/hf_generate.py --cache /tmp/fxpiece-hf
    python examples/hf_generate.py --cache /tmp/fxpiece-hf   # warm: 0 compiles

Needs ``transformers`` (a dev dependency). The token dim is the sequence
dim of ``input_ids`` (``dynamic_arg_dims={"input_ids": 1}``), marked
backed (``dynamic="backed"``): unbacked sizes make transformers' masking
code break the graph. The KV cache's length is a varying dim
(``varying_dims={"cache": 2}``): dynamic, so a longer cache traces no new
graph, but never dispatched on. Prefill dispatches on the prompt length,
each decode step on 1 token (the ``[1, 1]`` entry), whatever the KV cache
length; the printed ``dispatch`` shows which entry served each token count.
Each of ``generate``'s three Dynamo graphs is captured ahead of time on the
first run, so the second traces nothing (``start``: ``aot-load``,
``aot_loads``: 3), whatever its ``--prompt-len``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fxpiece

MAX_TOKENS = 8
"""The largest prompt (and the compiled range's end)."""


def _dispatch(compiled: fxpiece.CompiledModel) -> dict[str, list[str]]:
    """Token count -> the entries that served it, over every piece that
    dispatches on the token count."""
    seen: dict[int, set[str]] = {}
    for graph in compiled.stats.graphs:
        for runner in graph.runners:
            for size, entry in runner.chosen.items():
                seen.setdefault(size, set()).add(str(entry) if entry else "uncompiled")
    return {str(k): sorted(v) for k, v in sorted(seen.items())}


def _generate(
    model: LlamaForCausalLM, ids: torch.Tensor, n: int
) -> tuple[torch.Tensor, float, float]:
    """Greedy ``generate`` twice: the output and the seconds of the first
    call (startup: trace, compile or load) and of the second (steady)."""
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, do_sample=False)
        times.append(time.perf_counter() - t0)
    return out, times[0], times[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", help="fxpiece cache root (required for --backend fxpiece)")
    p.add_argument("--new-tokens", type=int, default=5)
    p.add_argument(
        "--prompt-len",
        type=int,
        default=7,
        help=f"prompt tokens, 1 to {MAX_TOKENS}: any length is served by the same graphs",
    )
    p.add_argument(
        "--backend",
        choices=["fxpiece", "stock"],
        default="fxpiece",
        help="stock: torch.compile(backend='inductor') instead, for comparison",
    )
    a = p.parse_args()
    if not 1 <= a.prompt_len <= MAX_TOKENS:
        p.error(f"--prompt-len must be 1 to {MAX_TOKENS}")
    if a.backend == "fxpiece" and not a.cache:
        p.error("--cache is required with --backend fxpiece")
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
    ids = torch.randint(0, cfg.vocab_size, (1, a.prompt_len))
    with torch.no_grad():
        eager = model.generate(ids, max_new_tokens=a.new_tokens, do_sample=False)
    t_setup = time.perf_counter()
    if a.backend == "stock":
        # Stock torch.compile, for comparison (its caches: TORCHINDUCTOR_CACHE_DIR).
        model.forward = torch.compile(model.forward, backend="inductor")  # type: ignore[method-assign]
        setup = time.perf_counter() - t_setup
        out, seconds, again = _generate(model, ids, a.new_tokens)
        stats = torch._dynamo.utils.counters["stats"]
        report: dict[str, object] = {"graphs": stats["unique_graphs"]}
    else:
        config = fxpiece.CompileConfig(
            splitting_ops=["torch.nn.functional.scaled_dot_product_attention"],
            max_num_tokens=MAX_TOKENS,  # decode KV lengths go past it: not the token count
            compile_sizes=[1],
            dynamic="backed",
            cache_dir=a.cache,
        )
        compiled = fxpiece.compile(
            model.forward,
            config,
            dynamic_arg_dims={"input_ids": 1},
            varying_dims={"cache": 2},  # the KV cache's length: dynamic, not dispatched on
        )
        model.forward = compiled  # type: ignore[method-assign]
        setup = time.perf_counter() - t_setup
        before = fxpiece.counters.snapshot()
        out, seconds, again = _generate(model, ids, a.new_tokens)
        after = fxpiece.counters.snapshot()
        d = {k: after[k] - before[k] for k in after}
        report = {
            "graphs": len(compiled.stats.graphs),
            "inductor_compiles": d["num_inductor_compiles"],
            "entries_built": d["num_backend_compilations"],
            "cache_hits": d["num_cache_hits"],
            "corrupt": d["num_corrupt_artifacts"],
            "uncompiled_runs": d["num_uncompiled_runs"],
            "start": compiled.start.path if compiled.start else None,
            "aot_saves": d["num_aot_saves"],
            "aot_loads": d["num_aot_loads"],
            "aot_fallbacks": d["num_aot_fallbacks"],
            "dispatch": _dispatch(compiled),
        }
    result = {
        "tokens_equal_eager": bool(torch.equal(out, eager)),
        "seconds": round(seconds, 3),
        "setup_seconds": round(setup, 3),
        "steady_seconds": round(again, 4),
        **report,
    }
    print(json.dumps(result))
    return 0 if torch.equal(out, eager) else 1


if __name__ == "__main__":
    raise SystemExit(main())
