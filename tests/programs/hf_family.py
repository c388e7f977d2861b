"""Decoder families from tiny configs through the README's ``generate()``
recipe (SDPA split, backed token dim, the KV cache a varying dim), several
in one process: each family has its own model tag under one cache root.
Prints one JSON line per family: tokens equal eager, the start path, the
Inductor compiles that family's start made (or the error it raised).

    python tests/programs/hf_family.py phi3 mixtral llama --cache DIR
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from typing import Any

import torch
import transformers

import fxpiece

VOCAB = 256
PROMPT = 7  # prompt tokens; max_num_tokens is 8
NEW_TOKENS = 4
COUNTED = (
    "num_inductor_compiles",
    "num_aot_saves",
    "num_aot_loads",
    "num_aot_fallbacks",
    "num_uncompiled_runs",
)

COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
GPT2: dict[str, Any] = {
    "vocab_size": VOCAB,
    "n_embd": 64,
    "n_inner": 128,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", COMMON),
    # fused qkv projection: the attention inputs and output are views
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**COMMON, "num_key_value_heads": 4}),
    # qkv biases
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", COMMON),
    # RMS norm on q and k per head
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", COMMON),
    # scaled embeddings, GeLU MLP, tied embeddings
    "gemma": ("GemmaConfig", "GemmaForCausalLM", COMMON),
    # fused qkv (Conv1D c_attn), learned positions, no GQA
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", GPT2),
    # Mistral without a sliding window (a Llama-shaped model)
    "mistral": ("MistralConfig", "MistralForCausalLM", {**COMMON, "sliding_window": None}),
    # mixture of experts
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**COMMON, "num_local_experts": 4}),
    # sliding-window attention shorter than the prompt: the sliding cache's
    # length is capped at window - 1, a constant, so marking it a varying dim
    # is a SpecializedDimError (see "mistral-sliding-static" for the fix)
    "mistral-sliding": ("MistralConfig", "MistralForCausalLM", {**COMMON, "sliding_window": 4}),
    # the same, with the capped cache left out of varying_dims (not in the
    # test sweep: transformers' SDPA integration breaks the decode graph)
    "mistral-sliding-static": (
        "MistralConfig",
        "MistralForCausalLM",
        {**COMMON, "sliding_window": 4},
    ),
}
VARYING: dict[str, dict[str | int, int] | None] = {"mistral-sliding-static": None}
"""The recipe's ``varying_dims`` (``{"cache": 2}``) where a family differs."""

PREFILL: dict[str, str] = {"llama-prefill": "llama"}
"""Not ``generate()``: one forward over a 32-token prompt with an attention
mask and no KV cache, logits compared with eager. Layer 0's attention output
was recorded contiguous while the pieces were compiled for the transposed
layout a fake re-run gives it: the next piece asserted its strides."""
PREFILL_TOKENS = 32


def run_prefill(family: str, cache: str) -> dict[str, Any]:
    conf_name, model_name, kwargs = FAMILIES[PREFILL[family]]
    torch.manual_seed(0)
    cfg = getattr(transformers, conf_name)(**kwargs, attn_implementation="sdpa")
    model = getattr(transformers, model_name)(cfg).eval()
    ids = torch.randint(3, VOCAB, (1, PREFILL_TOKENS))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    config = fxpiece.CompileConfig(
        splitting_ops=["torch.nn.functional.scaled_dot_product_attention"],
        max_num_tokens=64,
        compile_sizes=[1],
        dynamic="backed",
        cache_dir=cache,
        model_tag=family,
    )
    compiled = fxpiece.compile(
        model.forward, config, dynamic_arg_dims={"input_ids": 1, "attention_mask": 1}
    )
    before = fxpiece.counters.snapshot()
    with torch.no_grad():
        out = compiled(input_ids=ids, attention_mask=mask, use_cache=False).logits
    start = compiled.start
    after = fxpiece.counters.snapshot()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTED}
    return {
        "logits_max_diff": float((out - eager).abs().max()),
        "start": start.path if start else None,
        **{k.removeprefix("num_"): v for k, v in delta.items()},
    }


def run_family(family: str, cache: str) -> dict[str, Any]:
    if family in PREFILL:
        return run_prefill(family, cache)
    conf_name, model_name, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, conf_name)(**kwargs, attn_implementation="sdpa")
    model = getattr(transformers, model_name)(cfg).eval()
    ids = torch.randint(3, VOCAB, (1, PROMPT))
    with torch.no_grad():
        eager = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    config = fxpiece.CompileConfig(
        splitting_ops=["torch.nn.functional.scaled_dot_product_attention"],
        max_num_tokens=8,
        compile_sizes=[1],
        dynamic="backed",
        cache_dir=cache,
        model_tag=family,
    )
    compiled = fxpiece.compile(
        model.forward,
        config,
        dynamic_arg_dims={"input_ids": 1},
        varying_dims=VARYING.get(family, {"cache": 2}),
    )
    model.forward = compiled
    before = fxpiece.counters.snapshot()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    start = compiled.start
    after = fxpiece.counters.snapshot()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTED}
    return {
        "tokens_equal_eager": bool(torch.equal(out, eager)),
        "start": start.path if start else None,
        "why_not_aot": start.why_not_aot if start else None,
        **{k.removeprefix("num_"): v for k, v in delta.items()},
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("families", nargs="+", choices=sorted([*FAMILIES, *PREFILL]))
    p.add_argument("--cache", required=True)
    a = p.parse_args()
    for i, family in enumerate(a.families):
        if i:  # each family's start as if first: no Dynamo state from the last one
            torch._dynamo.reset()
        try:
            result = run_family(family, a.cache)
        except Exception as e:  # one family's failure is reported, the next runs
            traceback.print_exc()
            result = {"error": type(e).__name__, "message": str(e)[:2000]}
        print(json.dumps({"family": family, **result}), flush=True)


if __name__ == "__main__":
    main()
