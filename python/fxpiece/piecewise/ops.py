"""Resolving ``splitting_ops``: operator names and Python callables.

A splitting op is given as

- ``"ns::op"`` (every overload of a registered operator) or
  ``"ns::op.overload"`` (one overload), matched against ``OpOverload`` /
  ``OpOverloadPacket`` targets of ``call_function`` nodes;
- a Python callable, or its dotted name such as
  ``"torch.nn.functional.scaled_dot_product_attention"``, matched by identity,
  so models without custom ops (e.g. Hugging Face ones) can be split.

>>> from fxpiece.piecewise.ops import resolve_splitting_ops
>>> spec = resolve_splitting_ops(["aten::mm", "torch.nn.functional.scaled_dot_product_attention"])
>>> sorted(spec.op_names)
['aten::mm']
"""

from __future__ import annotations

import difflib
import importlib
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from fxpiece.errors import ConfigError

__all__ = ["SplittingOps", "describe_target", "resolve_splitting_ops"]

SplittingOp = str | Callable[..., Any]


@dataclass(frozen=True, slots=True)
class SplittingOps:
    """Resolved splitting ops: qualified op names and callables."""

    op_names: frozenset[str]
    """``ns::op`` (all overloads) and ``ns::op.overload`` names."""
    callables: tuple[Callable[..., Any], ...]
    labels: tuple[str, ...]
    """How each op was given, canonicalised (for keys and messages)."""

    def matches(self, node: torch.fx.Node) -> str | None:
        """The label of the splitting op ``node`` calls, or ``None``."""
        if node.op != "call_function":
            return None
        t = node.target
        if isinstance(t, torch._ops.OpOverload):
            packet = t.overloadpacket._qualified_op_name
            full = f"{packet}.{t._overloadname}"
            if full in self.op_names:
                return full
            if packet in self.op_names:
                return str(packet)
            return None
        if isinstance(t, torch._ops.OpOverloadPacket):
            name = t._qualified_op_name
            return name if name in self.op_names else None
        for c, label in zip(self.callables, self.labels[len(self.op_names) :], strict=True):
            if t is c:
                return label
        return None

    def __bool__(self) -> bool:
        return bool(self.op_names or self.callables)


def describe_target(target: object) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.overloadpacket._qualified_op_name}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    return f"{mod}.{name}" if mod else str(name)


def _close(word: str, candidates: Iterable[str]) -> str:
    near = difflib.get_close_matches(word, list(candidates), n=5, cutoff=0.5)
    return f"; did you mean {', '.join(repr(n) for n in near)}?" if near else ""


def _resolve_op_name(name: str) -> str:
    ns, _, rest = name.partition("::")
    if not ns or not rest:
        raise ConfigError("splitting_ops", f"{name!r} is not 'ns::op' or 'ns::op.overload'")
    opname, _, overload = rest.partition(".")
    try:
        namespace = getattr(torch.ops, ns)
        packet = getattr(namespace, opname)
    except (AttributeError, RuntimeError):
        try:
            known = [n for n in dir(getattr(torch.ops, ns)) if not n.startswith("_")]
        except (AttributeError, RuntimeError):
            known = []
        hint = _close(opname, known) if known else ""
        raise ConfigError(
            "splitting_ops",
            f"unknown operator {name!r}{hint} (register it with torch.library before "
            "building the config, or pass the Python callable)",
        ) from None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        raise ConfigError("splitting_ops", f"{name!r} is not an operator")
    if overload:
        overloads: list[str] = list(packet.overloads())  # type: ignore[no-untyped-call]
        if overload not in overloads:
            raise ConfigError(
                "splitting_ops",
                f"operator {ns}::{opname} has no overload {overload!r}{_close(overload, overloads)}"
                f"; its overloads: {', '.join(overloads)}",
            )
        return f"{ns}::{opname}.{overload}"
    return f"{ns}::{opname}"


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _resolve_dotted(name: str, import_modules: bool) -> Callable[..., Any] | None:
    """The callable a dotted name names. Without ``import_modules`` only
    modules already imported are looked in (validating a config must not run
    any module's top-level code); ``None`` then means "not decidable yet"."""
    if not _DOTTED.fullmatch(name):
        raise ConfigError(
            "splitting_ops",
            f"{name!r} is neither an op name ('ns::op') nor a dotted Python name",
        )
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        modname = ".".join(parts[:i])
        if not import_modules:
            obj: Any = sys.modules.get(modname)
            if obj is None:
                continue
        else:
            try:
                obj = importlib.import_module(modname)
            except ImportError:
                continue
        for j, attr in enumerate(parts[i:]):
            nxt = getattr(obj, attr, None)
            if nxt is None:
                known = [n for n in dir(obj) if not n.startswith("_")]
                where = ".".join(parts[: i + j])
                raise ConfigError(
                    "splitting_ops",
                    f"{where} has no attribute {attr!r}{_close(attr, known)}",
                )
            obj = nxt
        if not callable(obj):
            raise ConfigError("splitting_ops", f"{name!r} is not callable")
        return obj  # type: ignore[no-any-return]
    if not import_modules:
        return None
    raise ConfigError("splitting_ops", f"cannot import a module from {name!r}")


def resolve_splitting_ops(
    ops: Iterable[SplittingOp], *, import_modules: bool = True
) -> SplittingOps:
    """Resolve names and callables; unknown names raise :class:`ConfigError`
    listing close matches. With ``import_modules=False`` (config validation)
    a dotted name whose module is not imported yet is only checked for its
    form and left out of the result."""
    names: list[str] = []
    callables: list[Callable[..., Any]] = []
    call_labels: list[str] = []
    for op in ops:
        if isinstance(op, str):
            if "::" in op:
                n = _resolve_op_name(op)
                if n not in names:
                    names.append(n)
            else:
                c = _resolve_dotted(op, import_modules)
                if c is not None and all(c is not x for x in callables):
                    callables.append(c)
                    call_labels.append(op)
        elif isinstance(op, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
            n = describe_target(op)
            if n not in names:
                names.append(n)
        elif callable(op):
            if all(op is not x for x in callables):
                callables.append(op)
                call_labels.append(describe_target(op))
        else:
            raise ConfigError(
                "splitting_ops",
                f"{op!r} is neither an op name ('ns::op') nor a callable or its dotted name",
            )
    return SplittingOps(frozenset(names), tuple(callables), tuple(names) + tuple(call_labels))
