"""Decoder families through the README's ``generate()`` recipe, each from a
tiny config (tests/programs/hf_family.py): tokens equal eager cold and warm,
the warm start compiles nothing and loads ahead of time. One cold process
runs every family, then one warm process (a fresh process for the cache;
Dynamo is reset between families), each family under its own model tag of
one cache root. Phi-3's fused qkv makes the attention op return another
layout than its fake (it crashed inside a compiled piece before the
boundary layouts were conformed). docs/model-families.md has the table.

A dim marked dynamic that the model's code makes a constant (a
sliding-window cache capped at its window) is a ``SpecializedDimError``
naming the argument and the fix, not Dynamo's ``ConstraintViolationError``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TESTS_DIR

import fxpiece

PROGRAM = TESTS_DIR / "programs" / "hf_family.py"
SWEEP = ["llama", "phi3", "qwen2", "qwen3", "gemma", "gpt2", "mistral", "mixtral"]
"""Families that must pass; docs/model-families.md says what each adds."""
SLIDING = "mistral-sliding"
PREFILL = "llama-prefill"

Results = dict[str, dict[str, Any]]


def _run(families: list[str], cache: Path) -> Results:
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), *families, "--cache", str(cache)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    results = {r.pop("family"): r for r in lines}
    assert sorted(results) == sorted(families), (results, proc.stderr[-3000:])
    return results


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Results]:
    pytest.importorskip("transformers")
    cache = tmp_path_factory.mktemp("families") / "cache"
    cold = _run([*SWEEP, PREFILL, SLIDING], cache)
    warm = _run([*SWEEP, PREFILL], cache)
    return {"cold": cold, "warm": warm}


@pytest.mark.slow
@pytest.mark.parametrize("family", SWEEP)
def test_family_generates_like_eager_and_warm_starts_without_compiling(
    family: str, sweep: dict[str, Results]
) -> None:
    cold, warm = sweep["cold"][family], sweep["warm"][family]
    # Cold: generate's three Dynamo graphs (prefill, first decode, later
    # decode) captured ahead of time, none traced by Dynamo. A family whose
    # pieces are the same code as an earlier one's (Mistral without a window
    # is Llama) builds them from the content-addressed store: 0 compiles.
    assert cold["tokens_equal_eager"] is True, cold
    assert cold["start"] == "aot-capture" and cold["aot_saves"] == 3, cold
    assert cold["aot_fallbacks"] == 0 and cold["uncompiled_runs"] == 0, cold
    # Warm (a fresh process): the three entries loaded, nothing compiled.
    assert warm["tokens_equal_eager"] is True, warm
    assert warm["start"] == "aot-load" and warm["aot_loads"] == 3, warm
    assert warm["inductor_compiles"] == 0 and warm["aot_fallbacks"] == 0, warm
    assert warm["uncompiled_runs"] == 0, warm


@pytest.mark.slow
def test_family_sweep_compiled_its_pieces(sweep: dict[str, Results]) -> None:
    compiles = {f: sweep["cold"][f]["inductor_compiles"] for f in SWEEP}
    assert compiles[SWEEP[0]] > 0 and sum(compiles.values()) > len(SWEEP), compiles


@pytest.mark.slow
def test_masked_prefill_pieces_get_the_layouts_they_were_compiled_for(
    sweep: dict[str, Results],
) -> None:
    """Llama, one 32-token forward with an attention mask: layer 0's
    attention output was recorded contiguous, but the next piece was
    compiled (from a fake re-run of the split graph, as an ahead-of-time
    capture does) for the transposed layout CPU attention returns; the
    eager piece conformed it to the recorded layout and the compiled piece
    asserted its strides. The fake re-run now conforms as the run does."""
    cold, warm = sweep["cold"][PREFILL], sweep["warm"][PREFILL]
    assert "error" not in cold and cold["logits_max_diff"] < 1e-4, cold
    assert cold["start"] == "aot-capture" and cold["aot_fallbacks"] == 0, cold
    assert "error" not in warm and warm["logits_max_diff"] < 1e-4, warm
    assert warm["start"] == "aot-load" and warm["inductor_compiles"] == 0, warm


@pytest.mark.slow
def test_sliding_window_cache_marked_varying_is_a_typed_error(
    sweep: dict[str, Results],
) -> None:
    """Mistral with a 4-token window and a 7-token prompt: its sliding cache
    holds window - 1 = 3 tokens at every decode step, a constant the mask
    code relies on, so ``varying_dims={"cache": 2}`` cannot hold."""
    r = sweep["cold"][SLIDING]
    assert r.get("error") == "SpecializedDimError", r
    msg = r["message"]
    assert msg.startswith("varying_dims: L['kwargs']['cache'].layers[0]"), msg
    assert "the constant 3" in msg and "leave argument 'cache' out of varying_dims" in msg, msg


class _Cache:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def _capped(x: torch.Tensor, cache: _Cache) -> torch.Tensor:
    if cache.t.shape[1] == 3:  # the code fixes the "varying" dim
        return x.sum(0) + cache.t
    return x.sum(0)


@pytest.mark.parametrize("aot", [True, False])
def test_varying_dim_the_code_fixes_is_a_specialized_dim_error(tmp_path: Path, aot: bool) -> None:
    config = fxpiece.CompileConfig(
        compiler="eager", cache_dir=str(tmp_path / "cache"), dynamic="backed", aot=aot
    )
    m = fxpiece.compile(_capped, config, dynamic_arg_dims={"x": 0}, varying_dims={"cache": 1})
    with pytest.raises(fxpiece.SpecializedDimError) as ei:
        m(x=torch.ones(5, 3), cache=_Cache(torch.ones(2, 3)))
    e = ei.value
    assert isinstance(e, fxpiece.ConfigError) and e.field == "varying_dims"
    assert e.dims == [("L['cache'].t.size()[1]", 3)]
    assert "leave argument 'cache' out of varying_dims" in str(e)
    assert type(e.__cause__).__name__ == "ConstraintViolationError"
    # Following the fix, the same call compiles and runs.
    ok = fxpiece.compile(_capped, config, dynamic_arg_dims={"x": 0})
    assert torch.equal(
        ok(x=torch.ones(5, 3), cache=_Cache(torch.ones(2, 3))), torch.full((2, 3), 6.0)
    )


def test_token_dim_the_code_fixes_is_a_specialized_dim_error(tmp_path: Path) -> None:
    def fixed(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] == 5 else x

    config = fxpiece.CompileConfig(
        compiler="eager", cache_dir=str(tmp_path / "cache"), dynamic="backed"
    )
    with pytest.raises(fxpiece.SpecializedDimError) as ei:
        fxpiece.compile(fixed, config)(torch.ones(5, 3))
    assert ei.value.field == "dynamic_arg_dims" and ei.value.dims == [("L['x'].size()[0]", 5)]
    assert "argument 'x'" in str(ei.value)
