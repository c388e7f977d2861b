"""``fxpiece.compile``: compile a model piecewise with the token dimension
dynamic, so token counts never trigger a recompile."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from fxpiece.config import CompileConfig
from fxpiece.errors import ConfigError, FxpieceError
from fxpiece.piecewise import _torch_compat
from fxpiece.piecewise.backend import Backend
from fxpiece.piecewise.stats import BackendStats

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

    @property
    def stats(self) -> BackendStats:
        return self.backend.stats

    def _mark(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        def dims_for(key: int | str, value: Any) -> tuple[int, ...]:
            if self.dynamic_arg_dims is None:
                return (0,) if isinstance(value, torch.Tensor) and value.dim() > 0 else ()
            d = self.dynamic_arg_dims.get(key, ())
            return (d,) if isinstance(d, int) else tuple(d)

        items: list[tuple[int | str, Any]] = [*enumerate(args), *kwargs.items()]
        for key, value in items:
            for d in dims_for(key, value):
                if not isinstance(value, torch.Tensor):
                    raise ConfigError(
                        "dynamic_arg_dims", f"argument {key!r} is not a tensor: {type(value)}"
                    )
                if d >= value.dim():
                    raise ConfigError(
                        "dynamic_arg_dims",
                        f"argument {key!r} has {value.dim()} dims; dim {d} does not exist",
                    )
                _torch_compat.mark_token_dim(value, d, self.backend.config.dynamic)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._mark(args, kwargs)
        try:
            with _torch_compat.token_dims_context(self.backend.config.dynamic):
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
