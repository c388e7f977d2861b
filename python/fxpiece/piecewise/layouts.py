"""Values at piece boundaries in the layout the compiled pieces expect.

A compiled piece is compiled for the strides its inputs had when Dynamo
traced the graph (the recorded fakes), and Inductor asserts them at run time.
An eager split op can return another layout than its fake said: which
kernel an op picks can depend on its inputs' real strides (CPU attention on a
view of a fused qkv projection returns a transposed output where the fake
was contiguous). So each eager piece's outputs are checked against the dense
layout (the dims' order, from the fake's strides) that their consumers were
compiled for, and copied into it only where they differ; an output whose
fake is not dense (a view into another tensor) is left alone.

>>> import torch
>>> fake = torch.empty(1, 4, 7, 16)               # what the trace recorded: contiguous
>>> orders = output_orders(fake)
>>> real = torch.randn(1, 7, 4, 16).transpose(1, 2)  # what the kernel returned
>>> fixed = conform(real, orders[0])
>>> fixed.stride(), torch.equal(fixed, real), conform(fixed, orders[0]) is fixed
((448, 112, 16, 1), True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "conform",
    "conform_fakes",
    "dense_order",
    "eager_piece",
    "output_orders",
    "piece_orders",
]

Order = tuple[int, ...] | None
"""The dims from innermost to outermost of a dense layout, or ``None``: leave as is."""


def _hint(v: Any) -> int | None:
    if isinstance(v, int):
        return v
    node = getattr(v, "node", None)
    hint = getattr(node, "hint", None)
    return hint if isinstance(hint, int) else None


def dense_order(t: torch.Tensor) -> Order:
    """The order of ``t``'s dims, innermost first, if ``t`` (a fake with
    symbolic sizes allowed) is dense in that order; ``None`` when it is not
    dense (a view into a larger tensor) or its sizes have no hints."""
    hinted = [_hint(s) for s in t.shape], [_hint(s) for s in t.stride()]
    if None in hinted[0] or None in hinted[1]:
        return None
    sizes: list[int] = [int(s) for s in hinted[0] if s is not None]
    strides: list[int] = [int(s) for s in hinted[1] if s is not None]
    order = sorted(range(t.dim()), key=lambda d: (strides[d], sizes[d]))
    expect = 1
    for d in order:
        if sizes[d] != 1 and strides[d] != expect:
            return None
        expect *= sizes[d]
    return tuple(order)


def _dense_strides(shape: Sequence[int], order: tuple[int, ...]) -> list[int]:
    strides = [0] * len(shape)
    expect = 1
    for d in order:
        strides[d] = expect
        expect *= shape[d]
    return strides


def conform(t: Any, order: Order) -> Any:
    """``t`` itself when it has the dense layout ``order`` (strides of size-1
    dims do not matter, as for Inductor's checks), else a copy in it."""
    if order is None or not isinstance(t, torch.Tensor) or len(order) != t.dim():
        return t
    shape = t.shape
    want = _dense_strides(shape, order)
    have = t.stride()
    if all(shape[d] == 1 or have[d] == want[d] for d in order):
        return t
    out = torch.empty_strided(shape, want, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def output_orders(value: Any) -> tuple[Order, ...]:
    """The dense order of each output fake (``None`` for a non-tensor or a
    non-dense one) of a piece whose recorded output is ``value`` (one
    value or a tuple)."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    return tuple(dense_order(v) if isinstance(v, torch.Tensor) else None for v in values)


def piece_orders(gm: torch.fx.GraphModule) -> tuple[bool, tuple[Order, ...]]:
    """Whether the piece returns a tuple, and the dense order of each of its
    recorded output fakes (what :func:`eager_piece` conforms them to)."""
    (value,) = gm.graph.find_nodes(op="output")[0].args
    multi = isinstance(value, (tuple, list))
    nodes = value if multi else (value,)
    fakes = tuple(
        n.meta.get("example_value", n.meta.get("val")) if isinstance(n, torch.fx.Node) else None
        for n in nodes
    )
    return multi, output_orders(fakes)


def conform_fakes(gm: torch.fx.GraphModule, out: Any) -> Any:
    """The fake outputs ``out`` of eager piece ``gm`` (a fake run of the
    split module, whose values the compiled pieces may be compiled for) in
    the layouts :func:`eager_piece` gives the real ones: a fake run must
    see what the compiled pieces will be called with, not what the split
    op's meta kernel returns for the fake run's input layouts (which can
    differ from the recorded ones: Llama's prefill with a mask, layer 0)."""
    multi, orders = piece_orders(gm)

    def one(v: Any, order: Order) -> Any:
        if order is None or not isinstance(v, torch.Tensor) or len(order) != v.dim():
            return v
        return torch.empty_strided(
            v.shape, _dense_strides(v.shape, order), dtype=v.dtype, device=v.device
        )

    if not multi:
        return one(out, orders[0])
    return type(out)(one(v, o) for v, o in zip(out, orders, strict=False))


def eager_piece(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """What the stitched graph calls for an eager (split-op) piece: its own
    code (no ``nn.Module`` call machinery), with its outputs conformed to
    the layouts its recorded fakes have, where those are dense. (A fake run
    of the split module gives its fakes the same layouts:
    :func:`conform_fakes`.)"""
    multi, orders = piece_orders(gm)
    fn: Callable[..., Any] = gm.forward
    if not any(o is not None for o in orders):
        return fn
    if not multi:
        (order,) = orders

        def one(*args: Any) -> Any:
            return conform(fn(*args), order)

        return one

    def many(*args: Any) -> Any:
        out = fn(*args)
        return tuple(conform(v, o) for v, o in zip(out, orders, strict=False))

    return many
