"""``fxpiece.compile``: compile a model piecewise with the token dimension
dynamic, so token counts never trigger a recompile."""

from __future__ import annotations

import contextlib
import inspect
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

from fxpiece.config import CompileConfig
from fxpiece.errors import ConfigError, FxpieceError, NotRunnableError, SpecializedDimError
from fxpiece.piecewise import _torch_compat
from fxpiece.piecewise.aot_start import AotStart, StartInfo
from fxpiece.piecewise.backend import Backend
from fxpiece.piecewise.cache_open import model_tag_for
from fxpiece.piecewise.stats import BackendStats, StartupBreakdown

__all__ = ["CompiledModel", "compile"]

DynamicArgDims = Mapping[int | str, int | tuple[int, ...]]


class CompiledModel:
    """A model compiled by :func:`compile`; call it like the model."""

    def __init__(
        self,
        model: Callable[..., Any],
        backend: Backend,
        dynamic_arg_dims: DynamicArgDims | None,
        varying_dims: DynamicArgDims | None = None,
    ) -> None:
        self.model = model
        self.backend = backend
        self.dynamic_arg_dims = dynamic_arg_dims
        self.varying_dims = varying_dims
        self._compiled: Callable[..., Any] | None = None
        """``torch.compile(model)``, made when a call first needs Dynamo (an
        ahead-of-time start that serves every call never does: it skips
        the imports of Dynamo's debugging wrappers, Inductor's code cache
        among them)."""
        self._aot: AotStart | None = None

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_unpickled, (_describe(self.model),))

    @property
    def stats(self) -> BackendStats:
        return self.backend.stats

    @property
    def start(self) -> StartInfo | None:
        """How the first call started: ahead-of-time load, capture, or Dynamo
        (``None`` before the first call)."""
        return None if self._aot is None else self._aot.info

    @contextlib.contextmanager
    def _marked_for_capture(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
        """The call with its dynamic dims marked for an ahead-of-time
        capture, and the caller's tensors unmarked again after it (the saved
        guards reject a tensor that carries marks the capture did not see)."""
        touched: list[tuple[torch.Tensor, dict[str, Any]]] = []
        try:
            yield self._mark(args, kwargs, inplace=False, touched=touched)
        finally:
            # Newest first: a tensor held twice was recorded twice, the second
            # time already marked; its first record is the caller's state.
            for t, attrs in reversed(touched):
                t.__dict__.clear()
                t.__dict__.update(attrs)

    def _mark(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        inplace: bool = True,
        touched: list[tuple[torch.Tensor, dict[str, Any]]] | None = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Mark the token dims (and the varying dims) of the call's tensors
        dynamic: in place (what ``torch.compile`` reads), or on aliases
        (``inplace=False``: what the ahead-of-time capture reads). Tensors
        held inside a non-tensor argument (``varying_dims``) are marked in
        place either way; ``touched`` collects them with their attributes
        before marking, to restore."""
        mode = self.backend.config.dynamic

        def dims(spec: DynamicArgDims | None, key: int | str) -> tuple[int, ...]:
            d = spec.get(key, ()) if spec is not None else ()
            return (d,) if isinstance(d, int) else tuple(d)

        def token_dims(key: int | str, value: Any) -> tuple[int, ...]:
            if self.dynamic_arg_dims is None:
                return (0,) if isinstance(value, torch.Tensor) and value.dim() > 0 else ()
            return dims(self.dynamic_arg_dims, key)

        def marked(key: int | str, value: Any) -> Any:
            tdims = token_dims(key, value)
            vdims = dims(self.varying_dims, key)
            if not isinstance(value, torch.Tensor):
                if tdims:
                    raise ConfigError(
                        "dynamic_arg_dims", f"argument {key!r} is not a tensor: {type(value)}"
                    )
                for t in _held_tensors(value) if vdims else ():
                    if touched is not None:
                        touched.append((t, dict(t.__dict__)))
                    for d in vdims:
                        if d < t.dim():
                            _torch_compat.mark_token_dim(t, d, mode)
                return value
            if (tdims or vdims) and not inplace:
                value = value.detach().requires_grad_(value.requires_grad)
            for what, ds in (("dynamic_arg_dims", tdims), ("varying_dims", vdims)):
                for d in ds:
                    if d >= value.dim():
                        raise ConfigError(
                            what,
                            f"argument {key!r} has {value.dim()} dims; dim {d} does not exist",
                        )
                    _torch_compat.mark_token_dim(value, d, mode)
            if tdims:
                _torch_compat.set_token_dims(value, tdims)
            return value

        new_args = tuple(marked(i, a) for i, a in enumerate(args))
        new_kwargs = {k: marked(k, v) for k, v in kwargs.items()}
        return new_args, new_kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.backend.stats.startup is None:
            t0 = time.perf_counter()
            out = self._call(args, kwargs)
            self.backend.stats.startup = StartupBreakdown.measure(
                self.backend.stats.graphs, t0, time.perf_counter()
            )
            return out
        return self._call(args, kwargs)

    def _dynamo(self) -> Callable[..., Any]:
        if self._compiled is None:
            # torch.compile reads Inductor's folder (its bisector can swap
            # the backend): the backend's private one, never the global default.
            with self.backend.inductor_dirs.active():
                self._compiled = torch.compile(self.model, backend=self.backend, fullgraph=False)
        return self._compiled

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            with _torch_compat.token_dims_context(self.backend.config.dynamic):
                if self._aot is None:
                    model_tag = model_tag_for(self.backend.config)
                    self._aot = AotStart(self.backend, self.model, model_tag)
                    with self._marked_for_capture(args, kwargs) as (a, k):
                        self._aot.start(a, k)
                served, out = self._aot.call(args, kwargs)
                if served:
                    return out
                if self._aot.can_capture():
                    with self._marked_for_capture(args, kwargs) as (a, k):
                        added = self._aot.add(a, k)
                    if added:
                        served, out = self._aot.call(args, kwargs)
                        if served:
                            return out
                self._aot.fallback()
                self._mark(args, kwargs)
                return self._dynamo()(*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            # Surface our own typed errors (CacheError, ConfigError, ...) as
            # themselves rather than wrapped by Dynamo.
            inner = getattr(e, "inner_exception", None)
            if isinstance(inner, FxpieceError):
                raise inner from e
            raise
        except ConstraintViolationError as e:
            # Dims fxpiece marked dynamic that the model's code fixes.
            err = self._specialized(e)
            if err is None:
                raise
            raise err from e

    def _specialized(self, e: ConstraintViolationError) -> SpecializedDimError | None:
        """Dynamo's "you marked ... as dynamic but your code specialized it
        to be a constant" as a typed error naming the argument, the field it
        was marked through and the fix; ``None`` when the message names no
        such dim."""
        dims = [(src, int(c)) for src, c in _SPECIALIZED.findall(str(e))]
        if not dims:
            return None
        arg = _argument(dims[0][0])
        keys: set[int | str] = set() if arg is None else {arg}
        if isinstance(arg, str):
            with contextlib.suppress(TypeError, ValueError):
                params = list(inspect.signature(self.model).parameters)
                if arg in params:
                    keys.add(params.index(arg))
        vary = set(self.varying_dims or ())
        field = "varying_dims" if keys & vary or (not keys and vary) else "dynamic_arg_dims"
        src, const = dims[0]
        n = len(dims) - 1
        more = f" (and {n} more dim{'s' if n > 1 else ''} like it)" if n else ""
        what = f"argument {arg!r}" if arg is not None else "that argument"
        if field == "varying_dims":
            fix = (
                f"leave {what} out of varying_dims. A KV cache whose length is capped (a "
                "sliding-window cache once it holds window - 1 tokens) keeps a constant "
                "length: it is not a varying dim"
            )
        else:
            fix = (
                f"mark only the dims of {what} that carry the token count in "
                "dynamic_arg_dims (by default dim 0 of every tensor argument is marked)"
            )
        return SpecializedDimError(
            field,
            f"{src} is marked dynamic, but the model's code makes it the constant "
            f"{const}{more}, so it does not vary (Dynamo's ConstraintViolationError); "
            f"{fix}",
            dims,
        )


_SPECIALIZED = re.compile(
    r"You marked (\S+) as dynamic but your code specialized it to be a constant \((-?\d+)\)"
)


def _argument(source: str) -> int | str | None:
    """The call's argument a Dynamo source starts from: ``L['kwargs']['cache']...``
    and ``L['cache']...`` name ``'cache'``, ``L['args'][1]...`` position 1."""
    m = re.match(r"L\['kwargs'\]\['([^']+)'\]", source) or re.match(r"L\['args'\]\[(\d+)\]", source)
    if m is None:
        m = re.match(r"L\['([^']+)'\]", source)
        return None if m is None else m.group(1)
    g = m.group(1)
    return int(g) if g.isdigit() else g


def _held_tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The tensors a non-tensor argument holds (a KV cache object, a list, a
    dict): through lists, tuples, dicts and objects' attributes, 4 levels
    deep; modules (their parameters) are not entered."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth >= 4 or isinstance(value, torch.nn.Module | str | bytes | int | float | bool):
        return []
    if isinstance(value, dict):
        items: list[Any] = list(value.values())
    elif isinstance(value, list | tuple):
        items = list(value)
    elif hasattr(value, "__dict__"):
        items = list(vars(value).values())
    else:
        return []
    return [t for item in items for t in _held_tensors(item, depth + 1)]


def _describe(model: object) -> str:
    return getattr(model, "__qualname__", None) or type(model).__qualname__


class UnpickledCompiledModel:
    """What a pickled :class:`CompiledModel` loads as: its compiled state
    (a backend, Dynamo's caches) does not survive pickling, so calling it
    raises :class:`~fxpiece.errors.NotRunnableError`. Pickling one must work
    all the same: a model compiled as ``model.forward = fxpiece.compile(...)``
    holds it, and Dynamo's ahead-of-time capture pickles the module state
    its guards reach."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotRunnableError(
            f"fxpiece: a CompiledModel of {self.what} was restored from a pickle and cannot run "
            "(a backend and Dynamo's caches do not pickle); call fxpiece.compile on the model "
            "again"
        )


def _unpickled(what: str) -> UnpickledCompiledModel:
    return UnpickledCompiledModel(what)


def compile(
    model: Callable[..., Any],
    config: CompileConfig | None = None,
    dynamic_arg_dims: DynamicArgDims | None = None,
    backend: Backend | None = None,
    varying_dims: DynamicArgDims | None = None,
) -> CompiledModel:
    """Compile ``model`` piecewise.

    ``dynamic_arg_dims`` maps argument positions (or keyword names) to the
    dims that vary with the token count; by default dim 0 of every tensor
    argument. Those dims are marked dynamic on every call (backed or unbacked:
    ``config.dynamic``), so one graph serves every token count, 0 and 1
    included.

    ``backend`` is the backend to compile with, made by the caller with
    whatever it takes: ``Backend(config, progress=report)`` to follow each
    (piece, entry) as it is compiled or loaded, or
    ``fxpiece.distributed.DistributedBackend(config, group=pg)`` for a
    process group other than the default one. It carries the config, so
    ``config`` is then left out (or is that same config). By default,
    ``Backend(config)``. A backend serves one compiled model.

    ``varying_dims`` maps arguments to other dims that vary from call to
    call but are not the token count, such as a KV cache's length
    (``{"past_key_values": 2}``): they are marked dynamic the same way, so a
    longer cache does not trace a new graph, but pieces never dispatch on
    them. For a non-tensor argument (a cache object, a list, a dict) the
    dim applies to every tensor it holds that has it.

    >>> import torch, fxpiece
    >>> m = fxpiece.compile(torch.nn.Linear(4, 4), fxpiece.CompileConfig(compiler="eager",
    ...                     disable_cache=True))
    >>> m(torch.ones(3, 4)).shape
    torch.Size([3, 4])
    >>> events = []
    >>> cfg = fxpiece.CompileConfig(compiler="eager", disable_cache=True)
    >>> m = fxpiece.compile(torch.nn.Linear(4, 4), backend=fxpiece.Backend(cfg, events.append))
    >>> m(torch.ones(3, 4)).shape
    torch.Size([3, 4])
    >>> [e.action for e in events]
    ['compiled']
    """
    return CompiledModel(model, _backend_for(config, backend), dynamic_arg_dims, varying_dims)


def _backend_for(config: CompileConfig | None, backend: Backend | None) -> Backend:
    """``backend`` checked against ``config``, or a new ``Backend(config)``."""
    if backend is None:
        return Backend(config)
    if isinstance(backend, type):
        raise ConfigError(
            "backend",
            f"got the class {backend.__qualname__}; pass an instance made with the "
            f"arguments it needs, e.g. backend={backend.__qualname__}(config, progress=...)",
        )
    if not isinstance(backend, Backend):
        raise ConfigError(
            "backend", f"must be a fxpiece.Backend (or a subclass) instance, got {backend!r}"
        )
    if config is not None and config != backend.config:
        raise ConfigError(
            "config",
            "differs from backend.config; the backend carries the config: pass it to the "
            "backend and leave config out",
        )
    return backend
