"""The run-time path: pieces call Inductor's compiled ``call`` directly
(no AOTAutograd runtime wrapper) where that is exact, with outputs
identical to the wrapped path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_toy, token_ids

import fxpiece
from fxpiece.piecewise.compilers import InductorStandaloneCompiler
from fxpiece.toy_llama import ATTENTION_OP

SIZES = (1, 7, 16, 64, 256)


def _run(root: Path, direct: bool, grad: bool = False) -> tuple[dict[int, torch.Tensor], Any]:
    cfg = fxpiece.CompileConfig(
        compiler=InductorStandaloneCompiler(direct_call=direct),
        cache_dir=str(root),
        splitting_ops=[ATTENTION_OP],
        compile_ranges_endpoints=[16],
        max_num_tokens=256,
        compile_sizes=[7],
    )
    cm = fxpiece.compile(make_toy(2), cfg)
    outs = {}
    with torch.set_grad_enabled(grad):
        for n in SIZES:
            outs[n] = cm(token_ids(n))
    return outs, cm


@pytest.mark.slow
def test_direct_path_is_bit_identical_to_the_wrapped_path(tmp_path: Path) -> None:
    root = tmp_path / "c"
    fast, cm_fast = _run(root, direct=True)  # cold: compiles, then reloads each piece
    torch._dynamo.reset()
    old, cm_old = _run(root, direct=False)  # warm: loads the same artifacts, wrapped
    assert cm_old.stats.counters.num_inductor_compiles == 0
    for n in SIZES:
        assert fast[n].shape == (n, 64)
        assert torch.equal(fast[n], old[n]), n
    # Every compiled entry of the fast model took the direct path.
    for runner in cm_fast.stats.graphs[0].runners:
        for _entry, fn in runner.entries:
            assert fn.__name__.startswith("direct"), fn
    for runner in cm_old.stats.graphs[0].runners:
        for _entry, fn in runner.entries:
            assert not fn.__name__.startswith("direct"), fn
