"""The Python implementations the dispatcher holds for an operator.

``Library.impl`` (any dispatch key), ``torch.library.impl``,
``register_kernel`` and ``register_autograd`` on an op not made by
``custom_op`` hand the Python callable to C++ (a ``PythonKernelHolder``),
where Python cannot read it back. Both supported releases (2.9.1, 2.15)
expose the computed kernel of a dispatch key as a ``_SafeKernelFunction``
whose ``debug`` names the ``.py`` file of a Python registration. Such a
kernel is called with placeholder arguments under a tracer that stops at
the first Python frame: that frame is the implementation (or a torch
wrapper whose locals and closures hold it); nothing of the body runs.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Impl", "dispatcher_impls", "reachable_functions"]

PROBED_KEYS = (
    "CPU",
    "CUDA",
    "Meta",
    "XPU",
    "MPS",
    "HPU",
    "PrivateUse1",
    "AutogradCPU",
    "AutogradCUDA",
    "AutogradMeta",
    "AutogradXPU",
    "AutogradPrivateUse1",
    "AutogradOther",
)
"""Runtime keys whose computed kernels are probed (an alias key's kernel,
CompositeImplicitAutograd or Autograd, fills the keys with none of their own)."""

CORE_NAMESPACES = frozenset({"aten", "prims"})
"""Namespaces whose Python kernels torch registers itself (meta kernels):
a kernel of theirs that cannot be probed is left to the torch version."""


@dataclass(frozen=True, slots=True)
class Impl:
    """A Python implementation found behind ``op`` for ``key``: its code
    (``None`` when no Python frame ran: a builtin) and the functions its
    torch wrapper holds."""

    op: str
    key: str
    code: types.CodeType | None
    functions: tuple[Any, ...]


class _Stop(BaseException):
    """Raised by the tracer at the kernel's first Python frame."""


def _torch_dir() -> str:
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _placeholder(arg: Any) -> Any:
    kind = arg.type.kind()
    if kind == "OptionalType":
        return None
    if kind == "ListType":
        return []
    if kind == "TensorType":
        return torch.empty(0, device="meta")
    if kind in ("IntType", "SymIntType", "NumberType", "ScalarTypeType", "LayoutType"):
        return 0
    if kind in ("MemoryFormatType",):
        return torch.contiguous_format
    if kind in ("FloatType", "SymFloatType"):
        return 0.0
    if kind in ("BoolType", "SymBoolType"):
        return False
    if kind == "StringType":
        return ""
    if kind == "DeviceObjType":
        return torch.device("meta")
    raise TypeError(f"no placeholder for argument type {arg.type}")


def _placeholders(op: torch._ops.OpOverload) -> tuple[list[Any], dict[str, Any]]:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional_done = False
    for a in op._schema.arguments:
        if a.kwarg_only:
            if not a.has_default_value():
                kwargs[a.name] = _placeholder(a)
            continue
        if a.has_default_value():
            positional_done = True
            continue
        if positional_done:
            raise TypeError(f"argument {a.name} without a default after one with a default")
        args.append(_placeholder(a))
    return args, kwargs


def _first_frame(kernel: Any, args: list[Any], kwargs: dict[str, Any]) -> types.FrameType | None:
    """The first Python frame ``kernel`` runs, stopped before its body."""
    seen: list[types.FrameType] = []

    def tracer(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen.append(frame)
            raise _Stop

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        kernel.call_boxed(torch._C._dispatch_keyset_full(), *args, **kwargs)
    except _Stop:
        pass
    except Exception:
        if not seen:
            raise
    finally:
        sys.settrace(old)
    return seen[0] if seen else None


def dispatcher_impls(op: torch._ops.OpOverload) -> Iterator[Impl]:
    """Every Python kernel the dispatcher holds for ``op`` on the probed
    keys. Raises ``TypeError``/``RuntimeError`` when a kernel registered
    from Python cannot be probed (an argument type without a placeholder)."""
    name = op.name()  # type: ignore[no-untyped-call]
    dk = torch._C.DispatchKey
    torch_dir = _torch_dir()
    for key in PROBED_KEYS:
        if not hasattr(dk, key):
            continue
        try:
            if not torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, key):
                continue
            kernel = torch._C._dispatch_get_computed_kernel_for_dispatch_key(name, getattr(dk, key))
        except RuntimeError:
            continue
        debug = str(kernel)
        if ".py:" not in debug and "<" not in debug:
            continue  # a C++ kernel
        args, kwargs = _placeholders(op)
        frame = _first_frame(kernel, args, kwargs)
        if frame is None:
            yield Impl(name, key, None, ())
            continue
        code = frame.f_code
        if os.path.abspath(code.co_filename).startswith(torch_dir):
            fns = tuple(reachable_functions(frame.f_locals.values()))
            yield Impl(name, key, code, fns)
        else:
            yield Impl(name, key, code, ())


def reachable_functions(roots: Any, limit: int = 4000) -> Iterator[Any]:
    """Python functions reachable from ``roots`` through closures, wrappers,
    partials, bound methods, classes' and torch objects' attributes (what a
    torch wrapper holds: ``torch._disable_dynamo``'s ``fn``, an autograd
    kernel's generated ``Function`` and its ``Info``)."""
    todo = list(roots)
    seen: set[int] = set()
    while todo and len(seen) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(
            obj, torch.Tensor | types.ModuleType | torch._ops.OpOverload | type(None)
        ):
            continue
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            yield obj
            todo += [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
            wrapped = getattr(obj, "__wrapped__", None)
            if wrapped is not None:
                todo.append(wrapped)
        elif isinstance(obj, functools.partial):
            todo += [obj.func, *obj.args]
        elif isinstance(obj, types.MethodType | staticmethod | classmethod):
            todo.append(obj.__func__)
        elif isinstance(obj, type):
            if obj.__module__.startswith("torch"):
                todo += list(vars(obj).values())
        elif isinstance(obj, tuple | list):
            todo += list(obj)
        elif type(obj).__module__.startswith("torch._library"):
            todo += list(getattr(obj, "__dict__", {}).values())
            todo += [getattr(obj, s, None) for s in getattr(type(obj), "__slots__", ())]
        elif inspect.isfunction(vars(type(obj)).get("__call__")):
            todo += [vars(type(obj))["__call__"], *getattr(obj, "__dict__", {}).values()]


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True
