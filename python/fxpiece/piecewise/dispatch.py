"""Run-time dispatch of one compiled piece to the entry for the token count."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxpiece.counters import Counters
from fxpiece.errors import SizeOutOfRangeError
from fxpiece.ranges import Range, choose_entry

__all__ = ["PieceRunner", "concrete_inputs", "token_symbol_index"]


def token_symbol_index(args: Sequence[Any]) -> int | None:
    """Position of the first SymInt argument: its value is the token count."""
    for i, a in enumerate(args):
        if isinstance(a, torch.SymInt):
            return i
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


def concrete_inputs(args: Sequence[Any], sym_index: int, size: int) -> list[Any] | None:
    """Example inputs with the token symbol replaced by ``size`` (tensors
    allocated uninitialised); ``None`` if another symbol remains."""
    sym = args[sym_index].node.expr
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
    """Calls the compiled entry that serves the runtime size: an exact size
    wins over a range; a size outside every entry runs the piece's FX graph
    uncompiled (warned once, counted) or raises under ``strict``."""

    def __init__(
        self,
        *,
        index: int,
        graph: torch.fx.GraphModule,
        entries: Sequence[tuple[Range, Callable[..., Any]]],
        sym_index: int | None,
        strict: bool,
        counters: Sequence[Counters],
    ) -> None:
        self.index = index
        self.graph = graph
        self.entries = tuple(entries)
        self.sym_index = sym_index
        self.strict = strict
        self._counters = tuple(counters)
        self._fn_of = dict(self.entries)
        self._by_size: dict[int, Callable[..., Any]] = {}
        self._warned = False
        self.chosen: dict[int, Range | None] = {}
        """Which entry served each size seen so far (``None``: uncompiled)."""

    def __call__(self, *args: Any) -> Any:
        if self.sym_index is None:
            return self.entries[0][1](*args)
        size = args[self.sym_index]
        fn = self._by_size.get(size)
        if fn is None:
            fn = self._resolve(int(size))
            self._by_size[size] = fn
        return fn(*args)

    def _resolve(self, size: int) -> Callable[..., Any]:
        entry = choose_entry(tuple(self._fn_of), size)
        if entry is not None:
            self.chosen[size] = entry
            return self._fn_of[entry]
        entries = ", ".join(str(r) for r, _ in self.entries)
        if self.strict:
            raise SizeOutOfRangeError(
                f"piece {self.index}: token count {size} is outside every compiled entry "
                f"({entries}); raise max_num_tokens or add a range, or set strict=False to "
                "run it uncompiled"
            )
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"fxpiece: piece {self.index}: token count {size} is outside every compiled "
                f"entry ({entries}); running it uncompiled (counted in num_uncompiled_runs)",
                RuntimeWarning,
                stacklevel=3,
            )
        self.chosen[size] = None
        graph = self.graph
        counters = self._counters

        def uncompiled(*args: Any) -> Any:
            for c in counters:
                c.add("num_uncompiled_runs")
            return graph(*args)

        return uncompiled
