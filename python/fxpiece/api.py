"""``fxpiece.compile``: compile a model piecewise with the token dimension
dynamic, so token counts never trigger a recompile."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fxpiece.config import CompileConfig
from fxpiece.context import current_model_tag
from fxpiece.errors import ConfigError, FxpieceError
from fxpiece.piecewise import _torch_compat
from fxpiece.piecewise.aot_start import AotStart, StartInfo
from fxpiece.piecewise.backend import Backend
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
    ) -> None:
        self.model = model
        self.backend = backend
        self.dynamic_arg_dims = dynamic_arg_dims
        self._compiled = torch.compile(model, backend=backend, fullgraph=False)
        self._aot: AotStart | None = None

    @property
    def stats(self) -> BackendStats:
        return self.backend.stats

    @property
    def start(self) -> StartInfo | None:
        """How the first call started: ahead-of-time load, capture, or Dynamo
        (``None`` before the first call)."""
        return None if self._aot is None else self._aot.info

    def _mark(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], *, inplace: bool = True
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Mark the token dims of the call's tensors dynamic: in place (what
        ``torch.compile`` reads), or on aliases (``inplace=False``: what the
        ahead-of-time capture reads; the caller's tensors stay unmarked, as
        the loaded guards expect them)."""

        def dims_for(key: int | str, value: Any) -> tuple[int, ...]:
            if self.dynamic_arg_dims is None:
                return (0,) if isinstance(value, torch.Tensor) and value.dim() > 0 else ()
            d = self.dynamic_arg_dims.get(key, ())
            return (d,) if isinstance(d, int) else tuple(d)

        def marked(key: int | str, value: Any) -> Any:
            dims = dims_for(key, value)
            if dims and not isinstance(value, torch.Tensor):
                raise ConfigError(
                    "dynamic_arg_dims", f"argument {key!r} is not a tensor: {type(value)}"
                )
            if dims and not inplace:
                value = value.detach().requires_grad_(value.requires_grad)
            for d in dims:
                if d >= value.dim():
                    raise ConfigError(
                        "dynamic_arg_dims",
                        f"argument {key!r} has {value.dim()} dims; dim {d} does not exist",
                    )
                _torch_compat.mark_token_dim(value, d, self.backend.config.dynamic)
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

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            with _torch_compat.token_dims_context(self.backend.config.dynamic):
                if self._aot is None:
                    tag = current_model_tag()
                    model_tag = tag.tag if tag is not None else self.backend.config.model_tag
                    self._aot = AotStart(self.backend, self.model, model_tag)
                    self._aot.start(*self._mark(args, kwargs, inplace=False))
                served, out = self._aot.call(args, kwargs)
                if served:
                    return out
                self._mark(args, kwargs)
                return self._compiled(*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            # Surface our own typed errors (CacheError, ConfigError, ...) as
            # themselves rather than wrapped by Dynamo.
            inner = getattr(e, "inner_exception", None)
            if isinstance(inner, FxpieceError):
                raise inner from e
            raise


def compile(
    model: Callable[..., Any],
    config: CompileConfig | None = None,
    dynamic_arg_dims: DynamicArgDims | None = None,
    backend_cls: type[Backend] = Backend,
) -> CompiledModel:
    """Compile ``model`` piecewise.

    ``dynamic_arg_dims`` maps argument positions (or keyword names) to the
    dims that vary with the token count; by default dim 0 of every tensor
    argument. Those dims are marked dynamic on every call (backed or unbacked:
    ``config.dynamic``), so one graph serves every token count, 0 and 1
    included. ``backend_cls`` chooses the backend class (e.g.
    :class:`fxpiece.distributed.DistributedBackend`).

    >>> import torch, fxpiece
    >>> m = fxpiece.compile(torch.nn.Linear(4, 4), fxpiece.CompileConfig(compiler="eager",
    ...                     disable_cache=True))
    >>> m(torch.ones(3, 4)).shape
    torch.Size([3, 4])
    """
    return CompiledModel(model, backend_cls(config), dynamic_arg_dims)
