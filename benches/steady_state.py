"""Steady-state latency of fxpiece, whole-graph Inductor and eager, measured
in ONE process, interleaved.

Measured in separate processes, the ratio moved by 10-40% between runs on
this VM (the machine's speed drifts between the processes). Here the three
run the same toy Llama (same weights) in one process: after untimed warm-up
calls, each round times ``reps / rounds`` calls of each at each size, the
order rotating between rounds, and the median of every call's time is
compared. The caches are ``--cache-dir`` (fxpiece's) and its
``stock-inductor`` folder (Inductor's), as bench_startup.py leaves them.

    python benches/steady_state.py --cache-dir DIR --layers 4 --hidden 256 [--threads 1]
    python benches/steady_state.py --cache-dir DIR --model phi3   # or --model llama

``--model`` picks the model: ``toy`` (the demo's toy Llama, its attention
a custom op), or a Hugging Face decoder built from a config of the same
size, called as a prefill without a KV cache and split at SDPA as in the
README's recipe (``dynamic="backed"``): ``llama`` (``LlamaForCausalLM``) or
``phi3`` (``Phi3ForCausalLM``, whose fused qkv makes CPU attention return
another layout than its fake, so fxpiece copies the attention output into
the layout the next piece was compiled for: ``piecewise/layouts.py``).

The cost of those copies is measured apart, after the timed rounds (so the
timings are not perturbed): ``layouts.conform`` is wrapped to count its
calls and the copies it makes and to time it, per fxpiece call.

The last line printed is JSON: ``{size: {"eager": s, "inductor": s,
"fxpiece": s, "conform_calls": n, "conform_copies": n, "conform_s": s,
"conform_mean_s": s}}`` (the ``conform_*`` values are per fxpiece call;
``conform_s`` is the median; a callable that failed at a size is null).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MODELS = ("toy", "llama", "phi3")
HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
}
SDPA = "torch.nn.functional.scaled_dot_product_attention"


def _prefill_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **_: Any,
) -> tuple[Any, None]:
    """transformers' SDPA attention for a prefill without a KV cache and
    without grouped heads, with ``is_causal`` a bool: transformers computes
    ``q_length > 1 and ...``, a SymBool for a dynamic length of 1 (Dynamo
    breaks the graph on it) unless the length was compared with 1 before.
    Same call of ``torch.nn.functional.scaled_dot_product_attention``, same
    inputs."""
    import torch

    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=attention_mask is None,  # q and kv lengths are equal here
    )
    return out.transpose(1, 2).contiguous(), None


def hf_model(name: str, layers: int, hidden: int, max_tokens: int, dtype: Any) -> Any:
    """A Hugging Face decoder with the toy Llama's sizes (heads of 32,
    intermediate 2x hidden), seeded, attention by :func:`_prefill_sdpa`."""
    import torch
    import transformers
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    transformers.AttentionInterface.register("prefill_sdpa", _prefill_sdpa)
    AttentionMaskInterface.register("prefill_sdpa", sdpa_mask)

    conf_name, model_name = HF_CLASSES[name]
    torch.manual_seed(0)
    heads = max(1, hidden // 32)
    cfg = getattr(transformers, conf_name)(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=2 * max_tokens,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="prefill_sdpa",
    )
    return getattr(transformers, model_name)(cfg).eval().to(dtype)


def _models(
    model_name: str, cache_dir: str, layers: int, hidden: int, max_tokens: int
) -> tuple[dict[str, Callable[[Any], Any]], Callable[[int], Any]]:
    """The three callables (eager, whole-graph Inductor, fxpiece) and the
    input for ``n`` tokens."""
    if model_name == "toy":
        return _toy_models(cache_dir, layers, hidden, max_tokens)
    return _hf_models(model_name, cache_dir, layers, hidden, max_tokens)


def _toy_models(
    cache_dir: str, layers: int, hidden: int, max_tokens: int
) -> tuple[dict[str, Callable[[Any], Any]], Callable[[int], Any]]:
    """:func:`_models` for the demo's toy Llama: its callables and token ids."""
    import torch

    import fxpiece
    from fxpiece.demo import demo_config, demo_model
    from fxpiece.piecewise import _torch_compat

    model = demo_model(layers, hidden, "bfloat16")
    ours = fxpiece.compile(model, demo_config(cache_dir, max_tokens))
    stock_compiled = torch.compile(copy.deepcopy(model), backend="inductor")

    def stock(x: Any) -> Any:
        _torch_compat.mark_token_dim(x, 0)
        return stock_compiled(x)

    vocab = model.cfg.vocab_size
    return {
        "eager": model,
        "inductor": stock,
        "fxpiece": ours,
    }, lambda n: torch.arange(n) % vocab


def _hf_models(
    model_name: str, cache_dir: str, layers: int, hidden: int, max_tokens: int
) -> tuple[dict[str, Callable[[Any], Any]], Callable[[int], Any]]:
    """:func:`_models` for a Hugging Face decoder (:func:`hf_model`): its
    callables, each called as a prefill, and (token ids, attention mask)."""
    import torch

    import fxpiece
    from fxpiece.piecewise import _torch_compat

    hf = hf_model(model_name, layers, hidden, max_tokens, torch.bfloat16)
    hf_copy = copy.deepcopy(hf)
    # The README's recipe: the model's forward compiled, split at SDPA, backed,
    # an exact entry for 1 token; the demo's ranges.
    config = fxpiece.CompileConfig(
        splitting_ops=[SDPA],
        compile_ranges_endpoints=[16],
        max_num_tokens=max_tokens,
        compile_sizes=[1],
        dynamic="backed",
        cache_dir=cache_dir,
        model_tag=f"steady-{model_name}",
    )
    # With an attention mask (all ones), as generate() passes one: the mask
    # code then never compares the token count with 1, so one graph serves
    # every size (without it, a 1-token call gets a graph of its own).
    dims = {"input_ids": 1, "attention_mask": 1}
    ours = fxpiece.compile(hf.forward, config, dynamic_arg_dims=dims)
    stock_compiled = torch.compile(hf_copy.forward, backend="inductor")

    def eager(x: tuple[Any, Any]) -> Any:
        return hf(input_ids=x[0], attention_mask=x[1], use_cache=False).logits

    def fx(x: tuple[Any, Any]) -> Any:
        return ours(input_ids=x[0], attention_mask=x[1], use_cache=False).logits

    def stock(x: tuple[Any, Any]) -> Any:
        for t in x:
            _torch_compat.mark_token_dim(t, 1, "backed")
        with _torch_compat.token_dims_context("backed"):
            return stock_compiled(input_ids=x[0], attention_mask=x[1], use_cache=False).logits

    def tokens(n: int) -> tuple[Any, Any]:
        ids = (torch.arange(n) % 512).reshape(1, n)
        return ids, torch.ones_like(ids)

    return {"eager": eager, "inductor": stock, "fxpiece": fx}, tokens


def conform_cost(fn: Callable[[Any], Any], x: Any, calls: int) -> dict[str, float]:
    """Per call of ``fn``: how often ``layouts.conform`` runs, how many
    copies it makes, and the median over the calls of the seconds spent in
    it (``conform_s``; the mean, ``conform_mean_s``, is dominated by rare
    multi-millisecond stalls when the VM's other processes hold a core)."""
    from fxpiece.piecewise import layouts

    real = layouts.conform
    counts = {"conform_calls": 0, "conform_copies": 0}
    spent = [0.0]

    def timed(t: Any, order: Any) -> Any:
        t0 = time.perf_counter()
        out = real(t, order)
        spent[0] += time.perf_counter() - t0
        counts["conform_calls"] += 1
        counts["conform_copies"] += out is not t
        return out

    per_call: list[float] = []
    layouts.conform = timed  # eager_piece looks the name up at call time
    try:
        for _ in range(calls):
            spent[0] = 0.0
            fn(x)
            per_call.append(spent[0])
    finally:
        layouts.conform = real
    return {
        **{k: v / calls for k, v in counts.items()},
        "conform_s": statistics.median(per_call),
        "conform_mean_s": statistics.fmean(per_call),
    }


def _warm_up(
    fns: dict[str, Callable[[Any], Any]], inputs: dict[tuple[int, str], Any], sizes: list[int]
) -> set[tuple[int, str]]:
    """Three untimed calls of each callable at each size, the largest size
    first; the (size, name) pairs that failed (each said on stderr)."""
    failed: set[tuple[int, str]] = set()
    for n in sorted(sizes, reverse=True):
        for name in fns:
            try:
                for _ in range(3):
                    fns[name](inputs[(n, name)])
            except Exception as e:  # not timed; measure reports it as null
                failed.add((n, name))
                first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
                print(
                    f"bench: {name} at {n} tokens failed: {type(e).__name__}: {first}",
                    file=sys.stderr,
                )
    return failed


def _timed_rounds(
    fns: dict[str, Callable[[Any], Any]],
    inputs: dict[tuple[int, str], Any],
    sizes: list[int],
    rounds: int,
    per_round: int,
    failed: set[tuple[int, str]],
) -> dict[tuple[int, str], list[float]]:
    """``rounds`` rounds of ``per_round`` timed calls of each callable that did
    not fail at each size, the order rotating; every call's seconds."""
    times: dict[tuple[int, str], list[float]] = {(n, k): [] for n in sizes for k in fns}
    names = list(fns)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in sizes:
            for name in order:
                if (n, name) in failed:
                    continue
                fn, x = fns[name], inputs[(n, name)]
                out = times[(n, name)]
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    fn(x)
                    out.append(time.perf_counter() - t0)
    return times


def measure(
    cache_dir: str,
    layers: int,
    hidden: int,
    *,
    threads: int | None,
    sizes: list[int],
    reps: int,
    rounds: int,
    max_tokens: int = 256,
    model: str = "toy",
) -> dict[str, dict[str, float | None]]:
    import torch

    if threads:
        torch.set_num_threads(threads)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "stock-inductor")

    fns, make_input = _models(model, cache_dir, layers, hidden, max_tokens)
    # Each its own inputs: marking a tensor's dim dynamic for one (as stock
    # needs) would make the other's guards reject it.
    inputs = {(n, k): make_input(n) for n in sizes for k in fns}
    per_round = max(1, reps // rounds)
    with torch.no_grad():
        # Compile or load, then settle; the largest size first, as a server
        # starts. A callable that fails at a size (whole-graph Inductor on the
        # HF Llama's 1-token graph: a lowering assertion in torch) is said
        # on stderr, left out and reported as null.
        failed = _warm_up(fns, inputs, sizes)
        times = _timed_rounds(fns, inputs, sizes, rounds, per_round, failed)
        calls = max(10, reps // 2)
        cost = {
            n: conform_cost(fns["fxpiece"], inputs[(n, "fxpiece")], calls)
            for n in sizes
            if (n, "fxpiece") not in failed
        }
    return {
        str(n): {
            **{k: statistics.median(times[(n, k)]) if times[(n, k)] else None for k in fns},
            **cost.get(n, {}),
        }
        for n in sizes
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache-dir", required=True)
    p.add_argument(
        "--model",
        choices=MODELS,
        default="toy",
        help="toy: the demo's toy Llama; llama, phi3: a Hugging Face decoder of the same "
        "size, a prefill with an attention mask, split at SDPA (phi3: copies at the "
        "attention outputs)",
    )
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--threads", type=int)
    p.add_argument("--sizes", default="1,16,256")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    res = measure(
        a.cache_dir,
        a.layers,
        a.hidden,
        threads=a.threads,
        sizes=[int(s) for s in a.sizes.split(",")],
        reps=a.reps,
        rounds=a.rounds,
        model=a.model,
    )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
