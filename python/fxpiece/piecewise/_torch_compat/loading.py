"""Loading a ``standalone_compile`` artifact from verified bytes, and the
direct call path that skips AOTAutograd's runtime wrapper.

``CompiledArtifact.load`` reads a path and returns AOTAutograd's runtime
wrapper around Inductor's compiled graph. For an inference graph with no
input mutation, no output alias, no subclass, no RNG functionalisation and
no effect token, that wrapper only turns grad mode off around Inductor's
``call(list_of_args)``: :func:`load_standalone_bytes` then also returns
that ``call`` with the same grad handling and nothing else (the *direct*
path). The outputs are the very tensors the wrapper would return, since
the same kernels run on the same arguments.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["LoadedArtifact", "grad_off_call", "load_standalone_bytes", "unpacking"]


@dataclass(frozen=True, slots=True)
class LoadedArtifact:
    """A loaded piece: ``wrapped(*args)`` through AOTAutograd's runtime
    wrapper, and ``direct(*args)`` without it where that is exact
    (``None`` otherwise). Both return what the piece's graph returns: a
    tuple, or its one output unpacked (``returns_tuple=False``)."""

    wrapped: Callable[..., Any]
    direct: Callable[..., Any] | None
    why_not_direct: str | None = None
    compiled_graph: Any = None
    """Inductor's ``CompiledFxGraph`` whose ``call`` ``direct`` runs (when
    ``direct`` is set)."""


def load_standalone_bytes(data: bytes, returns_tuple: bool = True) -> LoadedArtifact:
    """Load a ``standalone_compile`` artifact from its verified bytes.

    In memory where this torch allows it (the same steps as
    ``CompiledArtifact.load(format="binary")``, without the file); else the
    bytes go to a file in a fresh private (0700) folder only this process
    writes, so what is loaded is exactly what was verified."""
    try:
        reader = _reader(data)
    except (ImportError, AttributeError):  # pragma: no cover - older torch
        reader = None
    if reader is not None:
        try:
            return _load_in_memory(reader, returns_tuple)
        except (ImportError, AttributeError, TypeError):  # pragma: no cover - older torch
            pass
    fn = _load_via_file(data)
    return LoadedArtifact(unpacking(fn, returns_tuple), None, "this torch has no in-memory load")


CACHE_HEADER = b"CacheCompiledArtifact"
"""What the binary format starts with on releases that write a header."""


def _reader(data: bytes) -> tuple[str, bytes] | None:
    """``(AOTAutograd cache key, cache artifacts)`` of the binary format;
    ``None`` for a format only ``CompiledArtifact.load`` knows."""
    from torch._inductor.codecache import torch_key
    from torch.utils._appending_byte_serializer import BytesReader

    reader = BytesReader(data)
    first = reader.read_bytes()
    if first == CACHE_HEADER:
        first = reader.read_bytes()
    elif first.isascii() and first.endswith(b"Artifact"):
        return None  # another header (AOTCompiledArtifact)
    if first != torch_key():
        raise RuntimeError("the artifact was compiled by another torch build")
    key = reader.read_str()
    payload = reader.read_bytes()
    if not reader.is_finished():
        raise RuntimeError("trailing bytes after the artifact")
    return key, payload


def _load_in_memory(parsed: tuple[str, bytes], returns_tuple: bool) -> LoadedArtifact:
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import _CompileFxKwargs
    from torch._inductor.cudagraph_utils import BoxedDeviceIndex
    from torch._inductor.utils import BoxedBool
    from torch._subclasses import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    key, payload = parsed
    torch.compiler.load_cache_artifacts(payload)
    with inductor_config.patch(unsafe_skip_cache_dynamic_shape_guards=True):
        with torch._functorch.config.patch(strict_autograd_cache=True):
            result = AOTAutogradCache._lookup(
                key, local=True, remote=False, args=[], cache_info={}, aot_config=None
            )
        if result is None:
            raise RuntimeError(f"AOTAutograd cache entry {key} not found after loading")
        entry = result[0]
        fx_config = _CompileFxKwargs(
            cudagraphs=BoxedBool(False), boxed_forward_device_index=BoxedDeviceIndex(0)
        )
        context = torch._guards.TracingContext(FakeTensorMode(shape_env=ShapeEnv()))
        with torch._guards.tracing(context):
            compiled_fn = entry.wrap_post_compile([], entry.sanitized_aot_config, fx_config)

    def boxed(*args: Any) -> Any:
        return compiled_fn(list(args))

    why = _why_not_direct(entry)
    graph = None if why is not None else _find_compiled_graph(compiled_fn)
    if why is None and graph is None:
        why = "Inductor's compiled graph was not found under the runtime wrapper"
    call = getattr(graph, "current_callable", None)
    if why is None and call is None:
        why = "Inductor's compiled graph has no callable"
    direct = None if why is not None or call is None else grad_off_call(call, returns_tuple)
    return LoadedArtifact(unpacking(boxed, returns_tuple), direct, why, graph if direct else None)


def _why_not_direct(entry: Any) -> str | None:
    """Why AOTAutograd's runtime wrapper does more for ``entry`` than turn
    grad mode off (``None``: it does not)."""
    meta = entry.runtime_metadata
    checks = (
        (entry.compiled_bw is not None, "it is a training graph"),
        (entry.maybe_subclass_meta is not None, "it has tensor subclasses"),
        (getattr(meta, "num_mutated_inp_runtime_indices", 1) != 0, "it mutates inputs"),
        (getattr(meta, "num_outputs_aliased", 1) != 0, "an output aliases"),
        (getattr(meta, "num_intermediate_bases", 1) != 0, "it has intermediate bases"),
        (bool(getattr(meta, "tokens", None)), "it has effect tokens"),
        (bool(getattr(meta, "is_rng_op_functionalized", False)), "it functionalises RNG"),
        (torch._C._is_any_autocast_enabled(), "autocast is on"),
        (
            any(getattr(w, "needs_post_compile", True) for w in entry.dispatch_wrappers),
            "a dispatch wrapper rewrites its arguments",
        ),
    )
    return next((why for bad, why in checks if bad), None)


def _find_compiled_graph(fn: Any) -> Any:
    """The one ``CompiledFxGraph`` the runtime wrapper closes over."""
    from torch._inductor.output_code import CompiledFxGraph

    found: list[Any] = []
    seen: set[int] = set()
    todo = [(fn, 0)]
    while todo:
        f, depth = todo.pop()
        if id(f) in seen or depth > 6:
            continue
        seen.add(id(f))
        for cell in getattr(f, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if isinstance(v, CompiledFxGraph):
                if all(v is not g for g in found):
                    found.append(v)
            elif callable(v) and not isinstance(v, type):
                todo.append((v, depth + 1))
    return found[0] if len(found) == 1 else None


def unpacking(fn: Callable[..., Any], returns_tuple: bool) -> Callable[..., Any]:
    """Make Inductor's list/tuple result match the graph: a tuple, or the
    single output unpacked."""
    if returns_tuple:

        def call_tuple(*args: Any) -> Any:
            out = fn(*args)
            return tuple(out) if isinstance(out, list) else out

        return call_tuple

    def call_single(*args: Any) -> Any:
        out = fn(*args)
        return out[0] if isinstance(out, list | tuple) else out

    return call_single


def grad_off_call(call: Callable[[list[Any]], Any], returns_tuple: bool) -> Callable[..., Any]:
    """Inductor's ``call`` with grad mode off (as the wrapper does for
    inference graphs: its out= kernels must not meet autograd) and the
    outputs unpacked, in one Python frame."""
    is_grad_enabled = torch.is_grad_enabled
    set_grad_enabled = torch._C._set_grad_enabled

    def with_grad_off(args: list[Any]) -> Any:
        set_grad_enabled(False)
        try:
            return call(args)
        finally:
            set_grad_enabled(True)

    if returns_tuple:

        def direct_tuple(*args: Any) -> Any:
            out = with_grad_off(list(args)) if is_grad_enabled() else call(list(args))
            return tuple(out) if isinstance(out, list) else out

        return direct_tuple

    def direct_single(*args: Any) -> Any:
        if is_grad_enabled():
            return with_grad_off(list(args))[0]
        return call(list(args))[0]

    return direct_single


def _load_via_file(data: bytes) -> Callable[..., Any]:  # pragma: no cover - older torch
    import tempfile

    from torch._inductor.standalone_compile import CompiledArtifact

    with tempfile.TemporaryDirectory(prefix="fxpiece-load-") as d:
        path = os.path.join(d, "artifact.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        fn: Callable[..., Any] = CompiledArtifact.load(path=path, format="binary")
    return fn
