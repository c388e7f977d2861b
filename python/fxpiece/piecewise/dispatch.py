"""Run-time dispatch of one compiled piece to the entry for the token count."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxpiece.counters import Counters
from fxpiece.errors import SizeOutOfRangeError
from fxpiece.ranges import Range, choose_entry

__all__ = ["PieceRunner", "TokenArg", "concrete_inputs", "find_token_arg", "token_symbol"]


@dataclass(frozen=True, slots=True)
class TokenArg:
    """Where a piece's token count is at run time: argument ``index`` (a
    SymInt), or dim ``dim`` of argument ``index`` (a tensor)."""

    index: int
    dim: int | None = None

    def __str__(self) -> str:
        return f"arg {self.index}" if self.dim is None else f"arg {self.index} dim {self.dim}"


def token_symbol(fake_args: Sequence[Any], marked: Sequence[tuple[int, int]]) -> Any:
    """The symbol of the token count: the size of the first dim the user
    marked dynamic (``marked``: ``(graph input, dim)``), else the first
    symbolic size among the graph's inputs; ``None`` for a static graph."""
    for i, d in marked:
        a = fake_args[i]
        if isinstance(a, torch.Tensor) and d < a.dim():
            size = a.shape[d]
            if isinstance(size, torch.SymInt):
                return size.node.expr
    for a in fake_args:
        if isinstance(a, torch.SymInt):
            return a.node.expr
        if isinstance(a, torch.Tensor):
            for s in a.shape:
                if isinstance(s, torch.SymInt):
                    return s.node.expr
    return None


def find_token_arg(args: Sequence[Any], sym: Any) -> TokenArg | None:
    """Where ``sym`` is among a piece's arguments: a SymInt argument equal to
    it first, else a tensor dim equal to it; ``None`` if the piece does not
    see the token count."""
    if sym is None:
        return None
    for i, a in enumerate(args):
        if isinstance(a, torch.SymInt) and a.node.expr == sym:
            return TokenArg(i)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            for d, s in enumerate(a.shape):
                if isinstance(s, torch.SymInt) and s.node.expr == sym:
                    return TokenArg(i, d)
    return None


def _subst(v: Any, sym: Any, size: int) -> int | None:
    if isinstance(v, int):
        return v
    if isinstance(v, torch.SymInt):
        expr = v.node.expr
        if isinstance(expr, int):
            return expr
        # xreplace returns the replacement itself (a Python int) when the
        # whole expression is the token symbol, a sympy number otherwise.
        expr = expr.xreplace({sym: size})  # type: ignore[no-untyped-call]
        if isinstance(expr, int):
            return expr
        return int(expr) if getattr(expr, "is_number", False) else None
    return None


def concrete_inputs(args: Sequence[Any], sym: Any, size: int) -> list[Any] | None:
    """Example inputs with the token symbol replaced by ``size`` (tensors
    allocated uninitialised); ``None`` if another symbol remains."""
    out: list[Any] = []
    for a in args:
        if isinstance(a, torch.SymInt):
            v = _subst(a, sym, size)
            if v is None:
                return None
            out.append(v)
        elif isinstance(a, torch.Tensor):
            shape = [_subst(s, sym, size) for s in a.shape]
            stride = [_subst(s, sym, size) for s in a.stride()]
            if any(s is None for s in shape) or any(s is None for s in stride):
                return None
            t = torch.empty_strided(
                [int(s) for s in shape if s is not None],
                [int(s) for s in stride if s is not None],
                dtype=a.dtype,
                device=a.device,
            )
            if isinstance(a, torch.nn.Parameter) or getattr(a, "_is_param", False):
                t = torch.nn.Parameter(t, requires_grad=a.requires_grad)
            out.append(t)
        else:
            out.append(a)
    return out


class PieceRunner:
    """Calls the compiled entry that serves the runtime token count: an
    exact size wins over a range; a size outside every entry runs the
    piece's FX graph uncompiled (warned once, counted) or raises under
    ``strict``. The entry of each size is looked up once, then one dict
    lookup per call."""

    def __init__(
        self,
        *,
        index: int,
        graph: torch.fx.GraphModule,
        entries: Sequence[tuple[Range, Callable[..., Any]]],
        token_arg: TokenArg | None,
        strict: bool,
        counters: Sequence[Counters],
    ) -> None:
        self.index = index
        self.graph = graph
        self.entries = tuple(entries)
        self.token_arg = token_arg
        """Where the token count is among the piece's arguments (``None``: one entry)."""
        self.strict = strict
        self._counters = tuple(counters)
        self._fn_of = dict(self.entries)
        self._by_size: dict[int, Callable[..., Any]] = {}
        self._warned = False
        self.chosen: dict[int, Range | None] = {}
        """Which entry served each size seen so far (``None``: uncompiled)."""
        self.call: Callable[..., Any] = self._make_call()
        """What the stitched graph calls: the compiled function itself when
        there is one entry, else a size lookup."""

    def _make_call(self) -> Callable[..., Any]:
        ta = self.token_arg
        if ta is None:
            return self.entries[0][1]
        by_size = self._by_size
        resolve = self._resolve
        i, d = ta.index, ta.dim
        if d is None:

            def by_symint(*args: Any) -> Any:
                size = args[i]
                fn = by_size.get(size)
                if fn is None:
                    fn = by_size[size] = resolve(int(size))
                return fn(*args)

            return by_symint

        def by_dim(*args: Any) -> Any:
            size = args[i].shape[d]
            fn = by_size.get(size)
            if fn is None:
                fn = by_size[size] = resolve(int(size))
            return fn(*args)

        return by_dim

    def __call__(self, *args: Any) -> Any:
        return self.call(*args)

    def _resolve(self, size: int) -> Callable[..., Any]:
        entry = choose_entry(tuple(self._fn_of), size)
        if entry is not None:
            self.chosen[size] = entry
            return self._fn_of[entry]
        entries = ", ".join(str(r) for r, _ in self.entries)
        if self.strict:
            raise SizeOutOfRangeError(
                f"piece {self.index}: token count {size} ({self.token_arg}) is outside every "
                f"compiled entry ({entries}); raise max_num_tokens or add a range, or set "
                "strict=False to run it uncompiled"
            )
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"fxpiece: piece {self.index}: token count {size} ({self.token_arg}) is outside "
                f"every compiled entry ({entries}); running it uncompiled (counted in "
                "num_uncompiled_runs)",
                RuntimeWarning,
                stacklevel=4,
            )
        self.chosen[size] = None
        graph = self.graph
        counters = self._counters

        def uncompiled(*args: Any) -> Any:
            for c in counters:
                c.add("num_uncompiled_runs")
            return graph(*args)

        return uncompiled
