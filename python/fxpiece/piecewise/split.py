"""Splitting an FX graph at chosen ops into pieces (a pure ``torch.fx`` pass).

Each call of a splitting op becomes a piece of its own (consecutive splitting
ops share one); every other run of nodes becomes a piece that a compiler will
handle. ``getitem`` on a node goes with its producer, so no tuple crosses a
boundary, and ``x.size()`` is decomposed into per-dimension sizes first, so no
``torch.Size`` crosses one either. Node order is kept.

>>> import torch, operator
>>> from fxpiece.piecewise.split import split_graph
>>> class M(torch.nn.Module):
...     def forward(self, x):
...         y = torch.relu(x)
...         z = torch.mm(y, y)
...         return z + 1
>>> gm = torch.fx.symbolic_trace(M())
>>> split_gm, items = split_graph(gm, [torch.mm])
>>> [(i.index, i.is_splitting_graph) for i in items]
[(0, False), (1, True), (2, False)]
>>> x = torch.randn(3, 3)
>>> torch.equal(split_gm(x), M()(x))
True
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from fxpiece.piecewise.ops import SplittingOp, SplittingOps, resolve_splitting_ops

__all__ = [
    "SplitItem",
    "boundary_nodes",
    "decompose_size_nodes",
    "piece_assignment",
    "readable_split",
    "split_graph",
    "whole_graph",
]


@dataclass(frozen=True, slots=True)
class SplitItem:
    """One piece of a split graph."""

    name: str
    """Attribute name of the piece in the split module (``submod_<graph_id>``)."""
    index: int
    """Position of the piece, 0-based; the cache keys use it."""
    graph_id: int
    is_splitting_graph: bool
    graph: torch.fx.GraphModule
    split_op: str | None
    """For a splitting piece, the splitting op that caused it."""

    @property
    def num_nodes(self) -> int:
        return sum(1 for n in self.graph.graph.nodes if n.op not in ("placeholder", "output"))


def _is_full_size(node: torch.fx.Node) -> bool:
    if node.op == "call_method" and node.target == "size":
        return len(node.args) == 1 and not node.kwargs
    return bool(
        node.op == "call_function"
        and node.target is getattr
        and len(node.args) == 2
        and node.args[1] == "shape"
    )


def _dim_sizes(node: torch.fx.Node) -> list[Any] | None:
    ev = node.meta.get("example_value")
    if ev is None:
        ev = node.meta.get("val")
    # Some producers (FakeTensorProp in torch 2.9) record the plain ints of a
    # size as None: the source tensor's shape is the better record then.
    if isinstance(ev, torch.Size | tuple | list) and all(d is not None for d in ev):
        return list(ev)
    src = node.args[0]
    if isinstance(src, torch.fx.Node):
        sv = src.meta.get("example_value", src.meta.get("val"))
        if isinstance(sv, torch.Tensor):
            return list(sv.shape)
    return None


def decompose_size_nodes(gm: torch.fx.GraphModule) -> int:
    """Replace each ``x.size()`` / ``x.shape`` whose value is known from node
    metadata by per-dimension ``x.size(i)`` nodes (static dimensions become
    int literals). ``size[i]`` uses get the single dimension; other uses get a
    tuple. Without metadata, each user gets its own ``x.size()`` call placed
    right before it. Returns how many size nodes were replaced."""
    g = gm.graph
    done = 0
    for node in list(g.nodes):
        if not _is_full_size(node):
            continue
        dims = _dim_sizes(node)
        src = node.args[0]
        if not isinstance(src, torch.fx.Node):
            continue
        if dims is None:
            # No shape metadata (e.g. a symbolic_trace graph): give every
            # user its own size() call right before it, so the tensor, not
            # the torch.Size, is what crosses a piece boundary.
            for user in list(node.users):
                with g.inserting_before(user):
                    dup = g.call_method("size", (src,))
                user.replace_input_with(node, dup)
            g.erase_node(node)
            done += 1
            continue
        per_dim: list[Any] = []
        with g.inserting_after(node):
            for i, d in enumerate(dims):
                if isinstance(d, int):
                    per_dim.append(d)
                    continue
                dn = g.call_method("size", (src, i))
                dn.meta["example_value"] = d
                per_dim.append(dn)
        for user in list(node.users):
            if (
                user.op == "call_function"
                and user.target is operator.getitem
                and user.args[0] is node
                and isinstance(user.args[1], int)
            ):
                user.replace_all_uses_with(per_dim[user.args[1]])
                g.erase_node(user)
            else:
                user.replace_input_with(node, tuple(per_dim))
        if not node.users:
            g.erase_node(node)
        done += 1
    if done:
        # Size nodes inserted after the size() node may come before a later
        # use only; keep the graph valid and topologically ordered.
        g.lint()
        gm.recompile()
    return done


def split_graph(
    gm: torch.fx.GraphModule,
    splitting_ops: SplittingOps | Iterable[SplittingOp],
) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Split ``gm`` at calls of ``splitting_ops``.

    Returns the stitched module (calling it equals calling ``gm``) and its
    pieces in execution order. ``gm`` is modified in place only by the size
    decomposition, which keeps its behaviour.
    """
    spec = (
        splitting_ops
        if isinstance(splitting_ops, SplittingOps)
        else resolve_splitting_ops(splitting_ops)
    )
    decompose_size_nodes(gm)
    assignment, split_ids = piece_assignment(gm, spec)
    split_gm = split_module(gm, gm, lambda n: assignment[n], keep_original_order=True)
    items: list[SplitItem] = []
    for name, mod in split_gm.named_children():
        if not name.startswith("submod_"):
            continue
        gid = int(name.removeprefix("submod_"))
        assert isinstance(mod, torch.fx.GraphModule)
        items.append(SplitItem(name, -1, gid, gid in split_ids, mod, split_ids.get(gid)))
    items.sort(key=lambda it: it.graph_id)
    items = [
        SplitItem(it.name, i, it.graph_id, it.is_splitting_graph, it.graph, it.split_op)
        for i, it in enumerate(items)
    ]
    return split_gm, items


def piece_assignment(
    gm: torch.fx.GraphModule, spec: SplittingOps | None
) -> tuple[dict[torch.fx.Node, int], dict[int, str]]:
    """Which piece each node (placeholders and output aside) goes to, and
    the splitting op of each splitting piece. ``spec=None``: one piece."""
    assignment: dict[torch.fx.Node, int] = {}
    split_ids: dict[int, str] = {}
    sid = 0
    prev_split = False
    started = False
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if (
            node.op == "call_function"
            and node.target is operator.getitem
            and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].op != "placeholder"
        ):
            assignment[node] = assignment[node.args[0]]
            continue
        label = spec.matches(node) if spec is not None else None
        if label is not None:
            if not prev_split and started:
                sid += 1
            split_ids.setdefault(sid, label)
            prev_split = True
        elif prev_split:
            sid += 1
            prev_split = False
        assignment[node] = sid
        started = True
    return assignment, split_ids


def boundary_nodes(gm: torch.fx.GraphModule, spec: SplittingOps | None) -> set[str]:
    """Names of the nodes whose recorded values (``example_value``) a split
    of ``gm`` reads when nothing is compiled: the inputs, every value that
    crosses from one piece to another (the pieces' arguments) and the sizes
    the size decomposition reads. ``gm`` is not modified.

    >>> import torch
    >>> from fxpiece.piecewise.ops import resolve_splitting_ops
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.mm(torch.relu(x), x).sin().cos())
    >>> sorted(boundary_nodes(gm, resolve_splitting_ops([torch.mm])))
    ['mm', 'relu', 'x']
    """
    assignment, _ = piece_assignment(gm, spec)
    keep: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            keep.add(node.name)
        elif _is_full_size(node):
            keep.add(node.name)
            if isinstance(node.args[0], torch.fx.Node):
                keep.add(node.args[0].name)
        piece = assignment.get(node)
        if piece is not None and any(
            u in assignment and assignment[u] != piece for u in node.users
        ):
            keep.add(node.name)
    return keep


def whole_graph(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Graph-partition mode: one piece, the whole graph (Inductor partitions)."""
    split_gm = split_module(gm, gm, lambda n: 0, keep_original_order=True)
    sub = split_gm.submod_0
    if not isinstance(sub, torch.fx.GraphModule):  # pragma: no cover - split_module's contract
        raise TypeError(f"split_module returned {type(sub).__name__} for submod_0")
    return split_gm, [SplitItem("submod_0", 0, 0, False, sub, None)]


def readable_split(split_gm: torch.fx.GraphModule, items: Sequence[SplitItem]) -> str:
    """The split graph as readable Python, each piece labelled."""
    lines = ["# fxpiece: the split graph; pieces marked SPLIT run eagerly.", ""]
    for it in items:
        kind = f"SPLIT at {it.split_op}" if it.is_splitting_graph else "compiled"
        lines.append(f"# piece {it.index} ({it.name}): {kind}, {it.num_nodes} nodes")
    lines.append("")
    lines.append(split_gm.print_readable(print_output=False))
    return "\n".join(lines)
