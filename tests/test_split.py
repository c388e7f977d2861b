"""fxpiece.split_graph on hand-made torch.fx graphs (no compiler involved)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from fxpiece import ConfigError, SplitItem, split_graph
from fxpiece.piecewise.split import decompose_size_nodes

# The pure-FX split reads node metadata whose form moves between torch
# releases: run by `make test-compat` on the oldest supported torch too.
pytestmark = pytest.mark.compat

aten = torch.ops.aten


# -- helpers ---------------------------------------------------------------


def _body(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


def _sig(n: torch.fx.Node) -> tuple[str, Any]:
    return (n.op, n.target)


def _kinds(items: list[SplitItem]) -> list[bool]:
    return [it.is_splitting_graph for it in items]


def _piece_sigs(items: list[SplitItem]) -> list[list[tuple[str, Any]]]:
    return [[_sig(n) for n in _body(it.graph)] for it in items]


def _is_tupleish(v: Any) -> bool:
    return isinstance(v, tuple | list | torch.Size)


def _boundary_values(
    split_gm: torch.fx.GraphModule, *args: Any
) -> tuple[Any, dict[str, tuple[list[Any], list[Any]]]]:
    """Run the split module; record each piece's arguments and its outputs
    (a multi-output piece's tuple is unpacked one level: that tuple is the
    piece's own output list, not a value that crosses)."""
    seen: dict[str, tuple[list[Any], list[Any]]] = {}

    class Rec(torch.fx.Interpreter):
        def call_module(self, target: Any, a: Any, kw: Any) -> Any:
            out = super().call_module(target, a, kw)
            sub = self.module.get_submodule(target)
            out_node = next(n for n in reversed(sub.graph.nodes) if n.op == "output")
            multi = isinstance(out_node.args[0], tuple | list)
            outs = list(out) if multi else [out]
            seen[str(target)] = ([*a, *kw.values()], outs)
            return out

    result = Rec(split_gm).run(*args)
    return result, seen


def assert_no_tuple_crosses(split_gm: torch.fx.GraphModule, *args: Any) -> Any:
    result, seen = _boundary_values(split_gm, *args)
    assert seen, "no piece was called"
    for name, (ins, outs) in seen.items():
        for v in ins:
            assert not _is_tupleish(v), f"{name} receives a {type(v).__name__}: {v!r}"
        for v in outs:
            assert not _is_tupleish(v), f"{name} returns a {type(v).__name__}: {v!r}"
    return result


def _graph(build: Callable[[torch.fx.Graph, torch.fx.Node], Any]) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(build(g, x))
    return torch.fx.GraphModule(torch.nn.Module(), g)


# -- pieces ------------------------------------------------------------------


def test_each_split_op_is_its_own_piece() -> None:
    def build(g: torch.fx.Graph, x: torch.fx.Node) -> Any:
        a = g.call_function(aten.relu.default, (x,))
        b = g.call_function(aten.mm.default, (a, a))
        c = g.call_function(aten.sin.default, (b,))
        d = g.call_function(aten.mm.default, (c, c))
        return g.call_function(aten.add.Tensor, (d, x))

    gm = _graph(build)
    x = torch.randn(4, 4)
    want = gm(x)
    split_gm, items = split_graph(gm, ["aten::mm"])
    assert _kinds(items) == [False, True, False, True, False]
    assert [it.index for it in items] == [0, 1, 2, 3, 4]
    assert [it.split_op for it in items] == [None, "aten::mm", None, "aten::mm", None]
    assert _piece_sigs(items) == [
        [("call_function", aten.relu.default)],
        [("call_function", aten.mm.default)],
        [("call_function", aten.sin.default)],
        [("call_function", aten.mm.default)],
        [("call_function", aten.add.Tensor)],
    ]
    assert all(getattr(split_gm, it.name) is it.graph for it in items)
    torch.testing.assert_close(split_gm(x), want, rtol=0, atol=0)


def test_consecutive_split_ops_share_one_piece() -> None:
    def build(g: torch.fx.Graph, x: torch.fx.Node) -> Any:
        a = g.call_function(aten.relu.default, (x,))
        b = g.call_function(aten.mm.default, (a, a))
        c = g.call_function(aten.mm.default, (b, a))
        d = g.call_function(aten.mm.default, (c, b))
        return g.call_function(aten.sin.default, (d,))

    gm = _graph(build)
    x = torch.randn(3, 3)
    want = gm(x)
    split_gm, items = split_graph(gm, ["aten::mm"])
    assert _kinds(items) == [False, True, False]
    assert [it.num_nodes for it in items] == [1, 3, 1]
    torch.testing.assert_close(split_gm(x), want, rtol=0, atol=0)


def test_split_op_first_and_last() -> None:
    def build(g: torch.fx.Graph, x: torch.fx.Node) -> Any:
        a = g.call_function(aten.mm.default, (x, x))
        b = g.call_function(aten.relu.default, (a,))
        return g.call_function(aten.mm.default, (b, b))

    gm = _graph(build)
    x = torch.randn(3, 3)
    want = gm(x)
    split_gm, items = split_graph(gm, ["aten::mm"])
    assert _kinds(items) == [True, False, True]
    torch.testing.assert_close(split_gm(x), want, rtol=0, atol=0)


def test_only_a_split_op() -> None:
    gm = _graph(lambda g, x: g.call_function(aten.mm.default, (x, x)))
    split_gm, items = split_graph(gm, ["aten::mm"])
    assert _kinds(items) == [True]
    x = torch.randn(2, 2)
    torch.testing.assert_close(split_gm(x), x @ x, rtol=0, atol=0)


@pytest.mark.parametrize("ops", [[], ["aten::mm"], [torch.sin]], ids=["none", "absent", "callable"])
def test_no_split_op_gives_one_piece(ops: list[Any]) -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) * 2 + x.sum()

    gm = torch.fx.symbolic_trace(M())
    n_before = len(_body(gm))
    split_gm, items = split_graph(gm, ops)
    assert len(items) == 1
    assert not items[0].is_splitting_graph
    assert items[0].num_nodes == n_before
    x = torch.randn(5)
    torch.testing.assert_close(split_gm(x), M()(x), rtol=0, atol=0)


def test_node_order_is_kept() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = torch.sin(x)
            b = torch.cos(x)
            c = torch.mm(a, b)
            d = torch.exp(c)
            e = torch.tanh(x)
            f = torch.mm(d, e)
            g = torch.mm(f, f)
            return g + a + e

    gm = torch.fx.symbolic_trace(M())
    original = [_sig(n) for n in _body(gm)]
    split_gm, items = split_graph(gm, [torch.mm])
    assert _kinds(items) == [False, True, False, True, False]
    flat = [s for piece in _piece_sigs(items) for s in piece]
    assert flat == original
    # The stitched module calls the pieces in order.
    calls = [n.target for n in split_gm.graph.nodes if n.op == "call_module"]
    assert calls == [it.name for it in items]
    x = torch.randn(4, 4)
    torch.testing.assert_close(split_gm(x), M()(x), rtol=0, atol=0)


# -- getitem -----------------------------------------------------------------


def test_getitem_goes_with_its_producer_even_after_a_split_op() -> None:
    """A tuple made before a split op but unpacked after it: the getitems
    stay with the producer, so the tuple never crosses."""

    def build(g: torch.fx.Graph, x: torch.fx.Node) -> Any:
        parts = g.call_function(aten.split.Tensor, (x, 2))
        m = g.call_function(aten.mm.default, (x, x))
        a = g.call_function(operator.getitem, (parts, 0))
        b = g.call_function(operator.getitem, (parts, 1))
        c = g.call_function(aten.cat.default, ([b, a],))
        return g.call_function(aten.add.Tensor, (m, c))

    gm = _graph(build)
    x = torch.randn(4, 4)
    want = gm(x)
    split_gm, items = split_graph(gm, ["aten::mm"])
    assert _kinds(items) == [False, True, False]
    assert _piece_sigs(items)[0] == [
        ("call_function", aten.split.Tensor),
        ("call_function", operator.getitem),
        ("call_function", operator.getitem),
    ]
    assert operator.getitem not in [t for _, t in _piece_sigs(items)[2]]
    got = assert_no_tuple_crosses(split_gm, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_getitem_of_a_tuple_returning_split_op_and_consecutive_ops() -> None:
    """The split op returns a tuple: its getitems join the split piece, and a
    second split op right after those getitems shares the piece."""

    def build(g: torch.fx.Graph, x: torch.fx.Node) -> Any:
        r = g.call_function(aten.relu.default, (x,))
        parts = g.call_function(aten.split.Tensor, (r, 2))
        a = g.call_function(operator.getitem, (parts, 0))
        b = g.call_function(operator.getitem, (parts, 1))
        m = g.call_function(aten.mul.Tensor, (a, b))
        s = g.call_function(aten.sin.default, (m,))
        return (s, b)

    gm = _graph(build)
    x = torch.randn(4, 3)
    want = gm(x)
    split_gm, items = split_graph(gm, ["aten::split.Tensor", "aten::mul"])
    assert _kinds(items) == [False, True, False]
    assert _piece_sigs(items)[1] == [
        ("call_function", aten.split.Tensor),
        ("call_function", operator.getitem),
        ("call_function", operator.getitem),
        ("call_function", aten.mul.Tensor),
    ]
    assert items[1].split_op == "aten::split.Tensor"
    got = assert_no_tuple_crosses(split_gm, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_getitem_under_symbolic_trace_of_unbind() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = torch.relu(x).unbind(0)
            a = torch.mm(q, k)
            return a + v

    gm = torch.fx.symbolic_trace(M())
    split_gm, items = split_graph(gm, [torch.mm])
    assert _kinds(items) == [False, True, False]
    assert [t for _, t in _piece_sigs(items)[0]].count(operator.getitem) == 3
    x = torch.randn(3, 4, 4)
    got = assert_no_tuple_crosses(split_gm, x)
    torch.testing.assert_close(got, M()(x), rtol=0, atol=0)


# -- sizes -------------------------------------------------------------------


class SizeModel(torch.nn.Module):
    """x.size() made before the split op; one dim used via getitem, the whole
    size passed to view; x.shape passed to reshape after it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.size()
        n = s[0]
        sh = x.shape
        y = torch.mm(x, x.t())
        w = (x * 2).view(s)
        z = y.sum(1).reshape(n, 1)
        return w.reshape(sh) + z


def _size_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [
        n
        for n in gm.graph.nodes
        if (n.op == "call_method" and n.target == "size" and len(n.args) == 1)
        or (n.op == "call_function" and n.target is getattr and n.args[1] == "shape")
    ]


def _propagate(gm: torch.fx.GraphModule, x: torch.Tensor, symbolic: bool) -> None:
    if symbolic:
        mode = FakeTensorMode(shape_env=ShapeEnv())
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
        fx = mode.from_tensor(x, symbolic_context=ctx)
        assert isinstance(fx.shape[0], torch.SymInt)
    else:
        mode = FakeTensorMode()
        fx = mode.from_tensor(x)
        assert all(isinstance(d, int) for d in fx.shape)
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(fx)


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "static"])
def test_size_never_crosses_as_torch_size(symbolic: bool) -> None:
    gm = torch.fx.symbolic_trace(SizeModel())
    assert len(_size_nodes(gm)) == 2
    _propagate(gm, torch.randn(4, 8), symbolic)
    split_gm, items = split_graph(gm, [torch.mm])
    assert _kinds(items) == [False, True, False]
    assert _size_nodes(gm) == []
    for it in items:
        assert _size_nodes(it.graph) == []
    sizes = [5, 1, 4] if symbolic else [4]
    for n in sizes:
        x = torch.randn(n, 8)
        got = assert_no_tuple_crosses(split_gm, x)
        torch.testing.assert_close(got, SizeModel()(x), rtol=0, atol=0)


def test_decompose_size_nodes_alone() -> None:
    bare = torch.fx.symbolic_trace(SizeModel())
    users = sum(len(n.users) for n in _size_nodes(bare))
    # No metadata: each user gets its own size() call right before it.
    assert decompose_size_nodes(bare) == 2
    dups = _size_nodes(bare)
    assert len(dups) == users and all(len(n.users) == 1 for n in dups)
    x = torch.randn(4, 8)
    torch.testing.assert_close(bare(x), SizeModel()(x), rtol=0, atol=0)
    gm = torch.fx.symbolic_trace(SizeModel())
    _propagate(gm, torch.randn(4, 8), symbolic=True)
    assert decompose_size_nodes(gm) == 2
    assert _size_nodes(gm) == []
    per_dim = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "size"]
    assert per_dim and all(n.args[1] == 0 for n in per_dim)  # dim 1 is static: a literal
    x = torch.randn(6, 8)
    torch.testing.assert_close(gm(x), SizeModel()(x), rtol=0, atol=0)


def test_dynamo_graph_with_size_splits_without_torch_size() -> None:
    captured: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        captured.append((gm, list(example_inputs)))
        return gm.forward

    def f(x: torch.Tensor) -> torch.Tensor:
        s = x.size()
        y = torch.mm(x, x.t())
        z = torch.relu(y).reshape(s[0], -1)
        return z.sum() + (x + 1).view(s)

    x0 = torch.randn(5, 3)
    torch._dynamo.mark_dynamic(x0, 0)
    torch.compile(f, backend=capture)(x0)
    (gm, example), *_ = captured
    assert sum(isinstance(a, torch.SymInt) for a in example) == 1
    assert any(n.op == "call_method" and n.target == "size" for n in gm.graph.nodes)
    split_gm, items = split_graph(gm, [torch.mm])
    assert _kinds(items) == [False, True, False]
    for n in (4, 7):
        x = torch.randn(n, 3)
        args = [n if isinstance(a, torch.SymInt) else x for a in example]
        got = assert_no_tuple_crosses(split_gm, *args)
        (got,) = got
        torch.testing.assert_close(got, f(x), rtol=0, atol=0)


# -- naming ops --------------------------------------------------------------


def _mm_addmm_graph() -> torch.fx.GraphModule:
    def build(g: torch.fx.Graph, x: torch.fx.Node) -> Any:
        a = g.call_function(aten.mm.default, (x, x))
        b = g.call_function(aten.relu.default, (a,))
        c = g.call_function(aten.addmm.default, (b, b, b))
        d = g.call_function(aten.sin.default, (c,))
        return g.call_function(aten.cos.default, (d,))

    return _graph(build)


@pytest.mark.parametrize(
    ("ops", "kinds"),
    [
        (["aten::mm"], [True, False]),
        (["aten::mm.default"], [True, False]),
        (["aten::mm.out"], [False]),
        (["aten::addmm"], [False, True, False]),
        (["aten::addmm.default", "aten::mm"], [True, False, True, False]),
        (["aten::addmm.default", "aten::relu", "aten::mm"], [True, False]),
        ([aten.mm.default], [True, False]),
        ([aten.addmm], [False, True, False]),
    ],
)
def test_op_names_and_overloads(ops: list[Any], kinds: list[bool]) -> None:
    gm = _mm_addmm_graph()
    x = torch.randn(3, 3)
    want = gm(x)
    split_gm, items = split_graph(gm, ops)
    assert _kinds(items) == kinds
    torch.testing.assert_close(split_gm(x), want)


def test_op_packet_target_matches_op_name() -> None:
    def build(g: torch.fx.Graph, x: torch.fx.Node) -> Any:
        a = g.call_function(aten.sin.default, (x,))
        b = g.call_function(aten.mm, (a, a))  # an OpOverloadPacket target
        return g.call_function(aten.cos.default, (b,))

    gm = _graph(build)
    x = torch.randn(3, 3)
    want = gm(x)
    split_gm, items = split_graph(gm, ["aten::mm"])
    assert _kinds(items) == [False, True, False]
    torch.testing.assert_close(split_gm(x), want, rtol=0, atol=0)


def test_callables_and_dotted_names() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = torch.nn.functional.relu(x)
            b = torch.sin(a)
            c = torch.nn.functional.gelu(b)
            return torch.cos(c)

    x = torch.randn(6)
    for ops, kinds in [
        ([torch.nn.functional.relu], [True, False]),
        (["torch.nn.functional.gelu"], [False, True, False]),
        (["torch.sin", torch.nn.functional.gelu], [False, True, False]),
        (["torch.nn.functional.relu", "torch.cos"], [True, False, True]),
    ]:
        gm = torch.fx.symbolic_trace(M())
        split_gm, items = split_graph(gm, ops)
        assert _kinds(items) == kinds, ops
        torch.testing.assert_close(split_gm(x), M()(x), rtol=0, atol=0)
    _, items = split_graph(torch.fx.symbolic_trace(M()), ["torch.nn.functional.gelu"])
    assert items[1].split_op == "torch.nn.functional.gelu"


def test_custom_op_name() -> None:
    import fxpiece.toy_llama  # noqa: F401  (registers fxpiece_toy::attention)

    def build(g: torch.fx.Graph, x: torch.fx.Node) -> Any:
        a = g.call_function(aten.relu.default, (x,))
        b = g.call_function(torch.ops.fxpiece_toy.attention.default, (a, a, a))
        return g.call_function(aten.sin.default, (b,))

    gm = _graph(build)
    x = torch.randn(5, 2, 4)
    want = gm(x)
    split_gm, items = split_graph(gm, ["fxpiece_toy::attention"])
    assert _kinds(items) == [False, True, False]
    assert items[1].split_op == "fxpiece_toy::attention"
    torch.testing.assert_close(split_gm(x), want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("name", "near"),
    [
        ("aten::mmm", "'mm'"),
        ("fxpiece_toy::attenton", "'attention'"),
        ("aten::mm.defualt", "'default'"),
        ("torch.nn.functional.scaled_dot_product_attentoin", "'scaled_dot_product_attention'"),
        ("torch.nn.functionl.relu", "'functional'"),
    ],
)
def test_unknown_op_name_lists_close_matches(name: str, near: str) -> None:
    import fxpiece.toy_llama  # noqa: F401

    with pytest.raises(ConfigError, match="splitting_ops") as ei:
        split_graph(_mm_addmm_graph(), [name])
    assert ei.value.field == "splitting_ops"
    assert isinstance(ei.value, ValueError)
    assert near in str(ei.value)


@pytest.mark.parametrize("bad", ["nosuchns_xyz::op", "mm", "::mm", 42])
def test_bad_op_specs(bad: Any) -> None:
    with pytest.raises(ConfigError) as ei:
        split_graph(_mm_addmm_graph(), [bad])
    assert ei.value.field == "splitting_ops"


def test_size_without_metadata_never_crosses_a_boundary() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = x.size()
            y = torch.mm(x, x)
            return y.view(s) + y.reshape(s[0], s[1])

    gm = torch.fx.symbolic_trace(M())
    split_gm, items = split_graph(gm, [torch.mm])
    x = torch.randn(3, 3)
    torch.testing.assert_close(split_gm(x), M()(x))
    out_of_first = next(n for n in items[0].graph.graph.nodes if n.op == "output")
    crossing = out_of_first.args[0]
    crossing = crossing if isinstance(crossing, tuple) else (crossing,)
    assert all(not (n.op == "call_method" and n.target == "size") for n in crossing)
    # Every size() now sits in the piece that uses it.
    last = items[-1].graph
    assert any(n.op == "call_method" and n.target == "size" for n in last.graph.nodes)


def test_recorded_piece_inputs_equal_propagated_ones() -> None:
    """The pieces' inputs read from Dynamo's recorded values (the fast path)
    have the metadata a fake run of the split module gives: same shapes
    (symbols included), strides, dtypes and order."""
    from fxpiece.piecewise import _torch_compat
    from fxpiece.piecewise.plan import fake_inputs, propagated_inputs, recorded_inputs

    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        # Dynamo hands the backend a fresh fake mode sharing its shape
        # environment: the recorded fakes are another mode's, same symbols.
        backend_mode = _torch_compat.detect_fake_mode(example_inputs)
        split_gm, items = split_graph(gm, [torch.mm])
        names = {it.name for it in items if not it.is_splitting_graph}
        recorded = recorded_inputs(split_gm, names, backend_mode)
        assert recorded is not None, "Dynamo's graph records every piece input"
        fakes = fake_inputs(example_inputs, backend_mode)
        seen.append((recorded, propagated_inputs(split_gm, fakes, backend_mode, names)))
        # Fakes of an unrelated fake mode (other symbols) are refused.
        other = torch._subclasses.FakeTensorMode(shape_env=ShapeEnv())
        assert recorded_inputs(split_gm, names, other) is None
        return gm.forward

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        s = x.size()
        y = torch.mm(x.t().contiguous().t() * 2, w)
        z = torch.relu(y)[:, :2].reshape(s[0], -1)
        return torch.mm(z, w[:2]).sum(-1, keepdim=True) + x.view(s)[:, :1]

    x0, w = torch.randn(5, 3), torch.randn(3, 3)
    torch._dynamo.mark_dynamic(x0, 0)
    torch.compile(f, backend=capture)(x0, w)
    ((recorded, propagated),) = seen
    assert recorded.keys() == propagated.keys() and len(recorded) == 3

    def meta(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return (str(tuple(v.shape)), str(v.stride()), v.dtype, v.requires_grad)
        return str(v)

    for name in recorded:
        assert [meta(v) for v in recorded[name]] == [meta(v) for v in propagated[name]], name
