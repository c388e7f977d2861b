"""A piece's Inductor wrapper module, run without importing Inductor.

Inductor compiles a piece to a Python *wrapper module* (its ``call(args)``
allocates buffers and calls the piece's C++ kernels, each a small Python
extension module, and extern kernels such as ``torch.mm``). Loading that
module the usual way goes through AOTAutograd's cache, Inductor's FX graph
cache and code caches: about a second of imports (``compile_fx``, the
lowering and autotuning stack) and torch's source hash, even when nothing
is compiled.

The *direct form* (:class:`DirectRecord`) is what the wrapper needs and
nothing else: its source, which extension module each kernel global is
(a path relative to Inductor's cache folder, where the piece's kernel
bundle is restored), and which torch function each extern kernel is.
:func:`run` executes the source with the handful of names it imports from
Inductor supplied by this module (the same definitions, see below); an
import of anything else from Inductor or Dynamo raises
:class:`DirectUnsupported`, and the caller loads the piece the usual way.

:func:`capture` makes the record from a wrapper Inductor has loaded, and
checks that running the record gives the same module: every global but the
kernels defined by the source itself (no constants set by Inductor's
loader), every kernel a loaded extension module in Inductor's folder, every
extern kernel a public torch function. The record is stored with the piece
(see :func:`pack`), so it is covered by the artifact's checksum and
signature; the kernels come from the verified kernel bundle, restored in a
folder only this process writes.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.util
import json
import os
import re
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "DirectRecord",
    "DirectUnsupported",
    "capture",
    "pack",
    "run",
    "unpack",
]

MAGIC = b"FXPIECE-DIRECT-1\n"
"""How a piece payload that carries a direct record starts (a plain
``standalone_compile`` payload starts with a length prefix, never this)."""

_MAX_RECORD = 64 << 20
_REL_PART = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,200}")
_EXTERN_USE = re.compile(r"\bextern_kernels\.([A-Za-z_][A-Za-z0-9_]*)")
_INDUCTOR_ALIGN_BYTES = 64
"""``torch._inductor.utils.ALIGN_BYTES``, checked by :func:`capture`."""


class DirectUnsupported(Exception):
    """The wrapper cannot be captured or run in the direct form (the reason
    is the message); the piece is loaded the usual way."""


@dataclass(frozen=True, slots=True)
class DirectRecord:
    """What a piece's wrapper module needs, besides torch."""

    source: str
    """The wrapper module's Python source, as Inductor generated it."""
    key: str
    """The module's ``key`` global (Inductor's code hash), set as its loader does."""
    kernels: Mapping[str, tuple[str, str]]
    """Kernel global -> (extension module name, path of its ``.so``
    relative to Inductor's cache folder)."""
    externs: Mapping[str, str]
    """``extern_kernels.<name>`` -> the ``torch.<attr>`` it is."""

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "source": self.source,
                "key": self.key,
                "kernels": {k: list(v) for k, v in sorted(self.kernels.items())},
                "externs": dict(sorted(self.externs.items())),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> DirectRecord:
        """Parse a stored record; anything malformed is :class:`DirectUnsupported`."""
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise DirectUnsupported(f"the direct record is not JSON ({e})") from None
        if not isinstance(raw, dict) or set(raw) != {"source", "key", "kernels", "externs"}:
            raise DirectUnsupported("the direct record has unexpected fields")
        source, key, kernels, externs = raw["source"], raw["key"], raw["kernels"], raw["externs"]
        if not isinstance(source, str) or not isinstance(key, str) or not isinstance(kernels, dict):
            raise DirectUnsupported("the direct record's source or kernels are malformed")
        if not isinstance(externs, dict):
            raise DirectUnsupported("the direct record's externs are malformed")
        got: dict[str, tuple[str, str]] = {}
        for name, v in kernels.items():
            ok = isinstance(v, list) and len(v) == 2 and all(isinstance(s, str) for s in v)
            if not ok or not _IDENT.fullmatch(name):
                raise DirectUnsupported(f"the direct record's kernel {name!r} is malformed")
            got[name] = (v[0], _check_rel(v[1]))
        for name, attr in externs.items():
            if not (isinstance(attr, str) and _IDENT.fullmatch(name) and _IDENT.fullmatch(attr)):
                raise DirectUnsupported(f"the direct record's extern {name!r} is malformed")
        return cls(source, key, got, dict(externs))


def pack(record: DirectRecord | None, standalone: bytes) -> bytes:
    """One piece payload: the direct record (if any) and the
    ``standalone_compile`` bytes, which load where the record cannot run."""
    if record is None:
        return standalone
    data = record.to_bytes()
    return MAGIC + len(data).to_bytes(8, "little") + data + standalone


def unpack(payload: bytes | memoryview) -> tuple[bytes | None, memoryview]:
    """``(record bytes or None, standalone bytes)`` of a piece payload."""
    view = memoryview(payload)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        return None, view
    start = len(MAGIC) + 8
    n = int.from_bytes(view[len(MAGIC) : start], "little")
    if len(view) < start or n > min(_MAX_RECORD, len(view) - start):
        raise DirectUnsupported("the piece payload's direct record is truncated")
    return bytes(view[start : start + n]), view[start + n :]


def _check_rel(rel: str) -> str:
    parts = rel.split("/")
    if not 1 <= len(parts) <= 4 or not all(
        _REL_PART.fullmatch(p) and p not in (".", "..") for p in parts
    ):
        raise DirectUnsupported(f"kernel path {rel!r} is not a plain relative path")
    if not rel.endswith(".so"):
        raise DirectUnsupported(f"kernel path {rel!r} is not a shared object")
    return rel


# -- running -------------------------------------------------------------------------
class _Pending:
    """What the stand-in ``AsyncCompile.cpp_pybinding`` returns; replaced by
    the kernel recorded for its global in ``wait``."""

    __slots__ = ()


def _load_kernel(module_name: str, rel: str, inductor_dir: str) -> Callable[..., Any]:
    """The ``kernel`` entry of a piece's C++ extension module, loaded as
    Inductor loads it (same module name, so a module Inductor already loaded
    in this process is shared)."""
    mod = sys.modules.get(module_name)
    if mod is None:
        path = os.path.join(inductor_dir, rel)
        if not os.path.isfile(path) or os.path.islink(path):
            raise DirectUnsupported(f"kernel {rel} is not in Inductor's folder")
        # The address the kernels read tensors' data pointers through, as
        # Inductor's loader sets it.
        os.environ["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] = str(
            torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr  # type: ignore[attr-defined]
        )
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise DirectUnsupported(f"kernel {rel} cannot be loaded as a module")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
    fn: Callable[..., Any] | None = getattr(mod, "kernel", None)
    if not callable(fn):
        raise DirectUnsupported(f"kernel module {module_name} has no kernel entry")
    return fn


def _stand_ins(record: DirectRecord, inductor_dir: str) -> dict[str, types.ModuleType]:
    """The names a wrapper imports from Inductor, defined as Inductor
    defines them (torch 2.9-2.15): kernels and extern kernels from the
    record; ``maybe_profile``, ``_align`` as in ``torch._inductor.utils``;
    ``run_intermediate_hooks`` never runs (:func:`capture` refuses a
    wrapper that calls it)."""

    class AsyncCompile:
        def cpp_pybinding(self, argtypes: list[str], source_code: str) -> _Pending:
            return _Pending()

        def wait(self, scope: dict[str, Any]) -> None:
            for name, value in list(scope.items()):
                if isinstance(value, _Pending):
                    if name not in record.kernels:
                        raise DirectUnsupported(f"kernel {name} is not in the record")
                    module_name, rel = record.kernels[name]
                    scope[name] = _load_kernel(module_name, rel, inductor_dir)

    externs = types.SimpleNamespace(
        **{name: getattr(torch, attr) for name, attr in record.externs.items()}
    )

    @contextlib.contextmanager
    def maybe_profile(should_profile: bool, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if should_profile:
            with torch.profiler.profile(*args, **kwargs) as p:
                yield p
        else:
            yield

    def _align(nbytes: int) -> int:
        return (nbytes + _INDUCTOR_ALIGN_BYTES - 1) & -_INDUCTOR_ALIGN_BYTES

    def run_intermediate_hooks(name: str, val: Any) -> None:
        raise DirectUnsupported("intermediate hooks are not run in the direct form")

    def module(name: str, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    return {
        "torch._inductor.async_compile": module("async_compile", AsyncCompile=AsyncCompile),
        "torch._inductor.select_algorithm": module("select_algorithm", extern_kernels=externs),
        "torch._inductor.utils": module("utils", maybe_profile=maybe_profile),
        "torch._inductor.codegen.memory_planning": module("memory_planning", _align=_align),
        "torch._inductor.hooks": module("hooks", run_intermediate_hooks=run_intermediate_hooks),
    }


def _importer(stand_ins: Mapping[str, types.ModuleType]) -> Callable[..., Any]:
    real_import = builtins.__import__

    def import_(
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: tuple[str, ...] | None = (),
        level: int = 0,
    ) -> Any:
        if level == 0 and name in stand_ins and fromlist:
            return stand_ins[name]
        if level != 0 or name.split(".")[:2] in (["torch", "_inductor"], ["torch", "_dynamo"]):
            raise DirectUnsupported(f"the wrapper imports {name}")
        return real_import(name, globals, locals, fromlist or (), level)

    return import_


def run(record: DirectRecord, inductor_dir: str, name: str) -> dict[str, Any]:
    """Execute the wrapper module's source; returns its globals (``call``
    among them). :class:`DirectUnsupported` when it needs anything the
    record does not give."""
    stand_ins = _stand_ins(record, inductor_dir)
    scope: dict[str, Any] = {
        "__name__": name,
        "__builtins__": {**builtins.__dict__, "__import__": _importer(stand_ins)},
        "key": record.key,
    }
    code = compile(record.source, f"<fxpiece direct {name}>", "exec", dont_inherit=True)
    exec(code, scope)
    if not callable(scope.get("call")):
        raise DirectUnsupported("the wrapper defines no call()")
    return scope


# -- capturing -----------------------------------------------------------------------
def capture(compiled_graph: Any, inductor_dir: str) -> DirectRecord:
    """The direct record of a wrapper Inductor has loaded
    (``compiled_graph``: its ``CompiledFxGraph``, whose ``current_callable``
    is the module's own ``call``). Runs the record once and compares the
    module it makes with Inductor's; :class:`DirectUnsupported` when they
    would differ."""
    from torch._inductor.utils import ALIGN_BYTES

    if ALIGN_BYTES != _INDUCTOR_ALIGN_BYTES:
        raise DirectUnsupported(f"Inductor aligns to {ALIGN_BYTES} bytes, not 64")
    call = getattr(compiled_graph, "current_callable", None)
    source = getattr(compiled_graph, "source_code", None)
    scope = getattr(call, "__globals__", None)
    if not isinstance(source, str) or not isinstance(scope, dict) or scope.get("call") is not call:
        raise DirectUnsupported("the compiled graph's callable is not its module's call()")
    if re.search(r"^\s+.*\brun_intermediate_hooks\(", source, re.MULTILINE):
        raise DirectUnsupported("the wrapper runs intermediate hooks")
    base = os.path.realpath(inductor_dir)
    kernels: dict[str, tuple[str, str]] = {}
    for name, value in scope.items():
        mod = getattr(value, "__self__", None)
        if not isinstance(value, types.BuiltinFunctionType) or not isinstance(
            mod, types.ModuleType
        ):
            continue
        path = getattr(mod, "__file__", None)
        if not isinstance(path, str) or not path.endswith(".so"):
            continue  # a torch builtin (assert_size_stride, ...), not a kernel
        real = os.path.realpath(path)
        if os.path.commonpath([real, base]) != base:
            raise DirectUnsupported(f"kernel {name} is outside Inductor's folder")
        kernels[name] = (mod.__name__, _check_rel(os.path.relpath(real, base)))
    externs: dict[str, str] = {}
    namespace = scope.get("extern_kernels")
    for name in sorted(set(_EXTERN_USE.findall(source))):
        fn = getattr(namespace, name, None)
        if fn is None or getattr(torch, name, None) is not fn:
            raise DirectUnsupported(f"extern kernel {name} is not torch.{name}")
        externs[name] = name
    key = scope.get("key")
    if not isinstance(key, str):
        raise DirectUnsupported("the wrapper module has no key")
    record = DirectRecord(source, key, kernels, externs)
    mine = run(record, base, "fxpiece_direct_capture")
    extra = sorted(k for k in scope if not k.startswith("__") and k not in mine)
    if any(mine[k] is not scope[k] for k in kernels):
        raise DirectUnsupported("a kernel loads as another module than Inductor's")
    if extra:
        raise DirectUnsupported(f"the loader sets globals the source does not: {extra[:5]}")
    return record
