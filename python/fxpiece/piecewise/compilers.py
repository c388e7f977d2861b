"""The built-in compilers: Inductor standalone artifacts, Inductor through
its FX graph cache, and eager."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from fxpiece.context import compiling_range
from fxpiece.errors import CacheError
from fxpiece.piecewise import _torch_compat
from fxpiece.piecewise._torch_compat import direct
from fxpiece.piecewise.interface import CompileContext, CompileResult, CompilerInterface
from fxpiece.ranges import Range

_log = logging.getLogger("fxpiece")

__all__ = [
    "EagerCompiler",
    "InductorFxCacheCompiler",
    "InductorStandaloneCompiler",
    "graph_returns_tuple",
    "make_compiler",
]

unpacking = _torch_compat.unpacking


def graph_returns_tuple(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph's output is a tuple/list (else a single value)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return isinstance(out.args[0], tuple | list)


def is_symbolic(example_inputs: Sequence[Any]) -> bool:
    """Whether any input has a symbolic size: such inputs are compiled with
    the tracing context's shapes, even for an exact size whose concrete
    inputs could not be made (another symbol remains)."""
    for a in example_inputs:
        if isinstance(a, torch.SymInt):
            return True
        if isinstance(a, torch.Tensor) and any(
            isinstance(d, torch.SymInt) for d in (*a.shape, *a.stride())
        ):
            return True
    return False


def _options(ctx: CompileContext) -> dict[str, Any]:
    opts = dict(ctx.inductor_config)
    if ctx.post_grad_pass is not None:
        opts["post_grad_custom_post_pass"] = ctx.post_grad_pass
    return opts


class EagerCompiler(CompilerInterface):
    """Runs each piece as its FX graph (no compilation); useful to debug."""

    name = "eager"
    load_uses_inputs = False

    def compile(
        self,
        graph: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        entry: Range,
        ctx: CompileContext,
    ) -> CompileResult:
        return CompileResult(graph.forward, {"eager": True})

    def load(
        self,
        handle: Any,
        graph: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        entry: Range,
        ctx: CompileContext,
    ) -> Callable[..., Any] | None:
        return graph.forward if handle == {"eager": True} else None


class InductorStandaloneCompiler(CompilerInterface):
    """``torch._inductor.standalone_compile``; each result is saved as one
    binary artifact in the content-addressed store and loaded from its
    verified bytes.

    ``direct_call`` (default): where AOTAutograd's runtime wrapper would only
    turn grad mode off (inference, no mutation, no alias; see
    :mod:`fxpiece.piecewise._torch_compat.loading`), pieces call Inductor's
    compiled ``call`` directly; ``False`` keeps the wrapper. The outputs are
    identical; only the Python per call differs."""

    name = "inductor"
    load_uses_inputs = False
    load_prepares_inductor = True

    def __init__(self, direct_call: bool = True) -> None:
        self.direct_call = direct_call

    def compute_hash(self) -> str:
        return f"{self.name}:{torch.__version__}"

    @property
    def is_inductor(self) -> bool:
        return True

    def compile(
        self,
        graph: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        entry: Range,
        ctx: CompileContext,
    ) -> CompileResult:
        dynamic = not entry.is_single_size or is_symbolic(example_inputs)
        with compiling_range(entry), _torch_compat.inductor_config_patch(_options(ctx)):
            art = _torch_compat.compile_standalone(
                graph, example_inputs, dynamic=dynamic, options={}
            )
        data = _torch_compat.standalone_bytes(art)
        returns_tuple = graph_returns_tuple(graph)
        fn: Callable[..., Any] | None = None
        record: direct.DirectRecord | None = None
        if data is not None and self.direct_call:
            # Run what a warm start runs: the same load, the same call path.
            try:
                fn, record = self._reload(data, returns_tuple, ctx)
            except Exception as e:
                _log.warning("fxpiece: reloading a compiled piece failed (%s); using it as is", e)
        handle = None
        if data is None and ctx.store is not None:
            _log.warning(
                "fxpiece: Inductor's result for %s cannot be saved (not serialisable); "
                "it is used in memory and compiled again next start",
                entry,
            )
        elif data is not None and ctx.store is not None:
            try:
                handle = ctx.store.put(ctx.digest, direct.pack(record, data))
            except CacheError as e:  # ENOSPC, EROFS, EACCES, path occupied
                _log.warning("fxpiece: could not store a compiled piece: %s", e)
        return CompileResult(fn if fn is not None else unpacking(art, returns_tuple), handle)

    def _reload(
        self, data: bytes, returns_tuple: bool, ctx: CompileContext
    ) -> tuple[Callable[..., Any], direct.DirectRecord | None]:
        """Load a piece just compiled from its bytes, and capture its direct
        form where it applies (see :mod:`~fxpiece.piecewise._torch_compat.direct`):
        the callable a warm start gets, and the record to store with it."""
        loaded = _torch_compat.load_standalone_bytes(data, returns_tuple)
        if loaded.direct is None:
            return loaded.wrapped, None
        if ctx.inductor is None or loaded.compiled_graph is None:
            return loaded.direct, None
        try:
            record = direct.capture(loaded.compiled_graph, ctx.inductor.cache)
            return self._run_direct(record, returns_tuple, ctx.inductor.cache, ctx.digest), record
        except direct.DirectUnsupported as e:
            _log.debug("fxpiece: piece %s has no direct form: %s", ctx.digest[:16], e)
            return loaded.direct, None

    @staticmethod
    def _run_direct(
        record: direct.DirectRecord, returns_tuple: bool, inductor_dir: str, digest: str
    ) -> Callable[..., Any]:
        scope = direct.run(record, inductor_dir, f"fxpiece_piece_{digest[:16]}")
        return _torch_compat.grad_off_call(scope["call"], returns_tuple)

    def _callable(self, data: bytes, returns_tuple: bool) -> Callable[..., Any]:
        loaded = _torch_compat.load_standalone_bytes(data, returns_tuple)
        if self.direct_call and loaded.direct is not None:
            return loaded.direct
        return loaded.wrapped

    def load(
        self,
        handle: Any,
        graph: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        entry: Range,
        ctx: CompileContext,
    ) -> Callable[..., Any] | None:
        if ctx.store is None:
            return None
        data = ctx.store.load(handle)
        if data is None:
            return None
        returns_tuple = graph_returns_tuple(graph)
        try:
            raw, standalone = direct.unpack(data)
        except direct.DirectUnsupported as e:
            _log.warning("fxpiece: piece %s: %s", ctx.digest[:16], e)
            return None  # counted corrupt and recompiled
        if raw is not None and self.direct_call and ctx.inductor is not None:
            # The wrapper and its kernels, without Inductor's loaders; else
            # (a kernel missing from the bundle, a wrapper that needs more)
            # the usual load, which rebuilds what is missing.
            try:
                record = direct.DirectRecord.from_bytes(raw)
                return self._run_direct(record, returns_tuple, ctx.inductor.cache, ctx.digest)
            except direct.DirectUnsupported as e:
                _log.warning("fxpiece: piece %s loads the usual way: %s", ctx.digest[:16], e)
        if ctx.inductor is not None:
            ctx.inductor.prepare()
        return self._callable(bytes(standalone), returns_tuple)


class InductorFxCacheCompiler(InductorStandaloneCompiler):
    """Inductor through its FX graph cache; the index keeps the FX graph
    cache key and the generated module's path as the handle."""

    name = "inductor-fx-cache"
    inductor_cache_subdirs = ("fxgraph",)
    load_uses_inputs = True
    load_prepares_inductor = False

    def compile(
        self,
        graph: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        entry: Range,
        ctx: CompileContext,
    ) -> CompileResult:
        with compiling_range(entry):
            fn, key = _torch_compat.compile_fx_cached(
                graph,
                example_inputs,
                dynamic=not entry.is_single_size or is_symbolic(example_inputs),
                options=_options(ctx),
            )
        handle = {"fx_graph_cache_key": key} if ctx.store is not None and key else None
        return CompileResult(unpacking(fn, graph_returns_tuple(graph)), handle)

    def load(
        self,
        handle: Any,
        graph: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        entry: Range,
        ctx: CompileContext,
    ) -> Callable[..., Any] | None:
        if not isinstance(handle, dict) or "fx_graph_cache_key" not in handle:
            return None
        fn = _torch_compat.load_fx_cached(str(handle["fx_graph_cache_key"]), example_inputs)
        if fn is None:
            return None
        return unpacking(_list_call(fn), graph_returns_tuple(graph))


def _list_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Inductor's compiled graphs take one list of args."""

    def call(*args: Any) -> Any:
        return fn(list(args))

    return call


def make_compiler(spec: str | CompilerInterface) -> CompilerInterface:
    if isinstance(spec, CompilerInterface):
        return spec
    factories: dict[str, Callable[[], CompilerInterface]] = {
        "inductor": InductorStandaloneCompiler,
        "inductor-fx-cache": InductorFxCacheCompiler,
        "eager": EagerCompiler,
    }
    return factories[spec]()
