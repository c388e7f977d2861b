"""``compile(..., varying_dims=...)``: dims that vary from call to call but
are not the token count (a KV cache's length) are dynamic, so a longer cache
traces no new graph, and no piece dispatches on them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import fxpiece
from fxpiece.errors import ConfigError
from fxpiece.toy_llama import ATTENTION_OP, attention


class Cache:
    def __init__(self) -> None:
        self.layers: list[dict[str, Any]] = []


def step(x: torch.Tensor, cache: Cache) -> torch.Tensor:
    # The cache is read first, so its tensors are the graph's first inputs
    # and their (varying) length its first symbol.
    extra = torch.zeros(16)
    for layer in cache.layers:
        extra = extra + layer["k"].sum(0)
    q, k, v = (x.view(-1, 2, 8) for _ in range(3))
    h = attention(q.contiguous(), k.contiguous(), v.contiguous()).reshape(-1, 16)
    return (h + extra) * 2.0


def _compiled(**kw: Any) -> fxpiece.CompiledModel:
    cfg = fxpiece.CompileConfig(
        compiler="eager", disable_cache=True, splitting_ops=[ATTENTION_OP], compile_sizes=[1]
    )
    return fxpiece.compile(step, cfg, dynamic_arg_dims={0: 0}, **kw)


def _cache(length: int) -> Cache:
    c = Cache()
    c.layers = [{"k": torch.ones(length, 16) * i, "flag": True} for i in range(2)]
    return c


def test_a_longer_cache_traces_no_new_graph_and_is_not_dispatched_on() -> None:
    cm = _compiled(varying_dims={1: 0})
    x = torch.randn(4, 16)
    for length in (3, 4, 7):
        out = cm(x[:1], _cache(length))
        torch.testing.assert_close(out, step(x[:1], _cache(length)))
    assert len(cm.stats.graphs) == 1
    g = cm.stats.graphs[0]
    # The token symbol is x's dim 0, not the cache length: every call ran 1 token.
    assert sorted({s for r in g.runners for s in r.chosen}) == [1]


def test_without_varying_dims_each_length_is_a_graph() -> None:
    cm = _compiled()
    x = torch.randn(4, 16)
    for length in (3, 4, 7):
        cm(x[:1], _cache(length))
    assert len(cm.stats.graphs) > 1  # Dynamo's automatic dynamic recompiles


def test_a_missing_dim_of_a_tensor_argument_is_a_config_error() -> None:
    cm = _compiled(varying_dims={0: 3})
    with pytest.raises(ConfigError, match=r"varying_dims.*dim 3 does not exist"):
        cm(torch.randn(2, 16), _cache(3))


def test_a_capture_leaves_the_callers_held_tensors_as_they_were() -> None:
    cm = _compiled(varying_dims={1: 0})
    shared = torch.ones(3, 16)
    shared.note = "mine"  # type: ignore[attr-defined]
    cache = Cache()
    cache.layers = [{"k": shared}, {"k": shared}]  # one tensor held twice
    with cm._marked_for_capture((torch.ones(1, 16), cache), {}):
        assert shared._has_dynamo_dim_marking  # type: ignore[attr-defined]
    assert vars(shared) == {"note": "mine"}
