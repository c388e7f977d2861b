"""Hugging Face ``generate()`` compiled piecewise with fxpiece.

A small Llama built from a config (random weights, no download), SDPA
attention as the split op. Run it twice: the first run compiles every
unique piece of every Dynamo graph ``generate`` produces, the second (a
fresh process) loads them all and compiles nothing::

    python examples/hf_generate.py --cache /tmp/fxpiece-hf
    python examples/hf_generate.py --cache /tmp/fxpiece-hf   # warm: 0 compiles

Needs ``transformers`` (a dev dependency). Token dims: ``fxpiece.compile``
marks dim 0 of every tensor argument (the batch dim here). Marking the
sequence dim (``dynamic_arg_dims={"input_ids": 1}``) makes Dynamo fail in
transformers' masking code on torch 2.15 ("vr must not be None"), with
backed and unbacked dims alike; see the README.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fxpiece


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", required=True, help="fxpiece cache root")
    p.add_argument("--new-tokens", type=int, default=5)
    a = p.parse_args()
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
    ids = torch.randint(0, cfg.vocab_size, (1, 7))
    with torch.no_grad():
        eager = model.generate(ids, max_new_tokens=a.new_tokens, do_sample=False)
    config = fxpiece.CompileConfig(
        splitting_ops=["torch.nn.functional.scaled_dot_product_attention"],
        max_num_tokens=64,
        compile_sizes=[1],
        cache_dir=a.cache,
    )
    compiled = fxpiece.compile(model.forward, config)
    model.forward = compiled  # type: ignore[method-assign]
    before = fxpiece.counters.snapshot()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=a.new_tokens, do_sample=False)
    seconds = time.perf_counter() - t0
    after = fxpiece.counters.snapshot()
    print(
        json.dumps(
            {
                "tokens_equal_eager": bool(torch.equal(out, eager)),
                "seconds": round(seconds, 2),
                "graphs": len(compiled.stats.graphs),
                "inductor_compiles": after["num_inductor_compiles"]
                - before["num_inductor_compiles"],
                "cache_hits": after["num_cache_hits"] - before["num_cache_hits"],
                "corrupt": after["num_corrupt_artifacts"] - before["num_corrupt_artifacts"],
            }
        )
    )
    return 0 if torch.equal(out, eager) else 1


if __name__ == "__main__":
    raise SystemExit(main())
