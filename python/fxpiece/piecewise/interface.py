"""The interface a compiler implements to be driven by the backend.

The backend calls :meth:`CompilerInterface.compile` once per piece and
compile entry (a range, compiled with symbolic shapes, or one exact size,
compiled with concrete shapes), stores the returned handle in the cache index,
and later calls :meth:`CompilerInterface.load` with that handle instead of
compiling again.

>>> from fxpiece.piecewise.interface import CompilerInterface, CompileResult
>>> class Identity(CompilerInterface):
...     name = "identity"
...     def compile(self, graph, example_inputs, entry, ctx):
...         return CompileResult(graph.forward, None)
>>> Identity().name
'identity'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fxpiece.ranges import Range

if TYPE_CHECKING:
    import torch.fx

    from fxpiece.cache.store import ArtifactStore

__all__ = ["CompileContext", "CompileResult", "CompilerInterface", "InductorFolder"]


class InductorFolder(Protocol):
    """Inductor's folders for a backend, active while it compiles or loads
    (:class:`fxpiece.piecewise._torch_compat.InductorDirs`)."""

    cache: str
    """Inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR`` in the block)."""

    def prepare(self) -> None:
        """Call before Inductor compiles or loads through its own caches."""
        ...


@dataclass(frozen=True, slots=True)
class CompileContext:
    """What a compiler may need besides the graph."""

    store: ArtifactStore | None
    """Where to put artifacts (``None`` when the cache is off or read-only)."""
    digest: str
    """Content digest of (piece, inputs, entry, compiler, options); unique name."""
    inductor_config: Mapping[str, Any] = field(default_factory=dict)
    post_grad_pass: Any = None
    """The pass manager to install as Inductor's post-grad custom pass, if any."""
    inductor: InductorFolder | None = None
    """Inductor's folders while this compiles or loads (the backend's
    private ones; kernel bundles are restored in ``inductor.cache``)."""


@dataclass(frozen=True, slots=True)
class CompileResult:
    fn: Callable[..., Any]
    """Called as ``fn(*args)``; returns what the piece's graph returns."""
    handle: Any
    """JSON-like value to store in the index (paths relative to the cache
    dir), or ``None`` if the result cannot be loaded later."""


class CompilerInterface(ABC):
    """Base class of compilers; subclass it to plug in your own."""

    name: str = "custom"
    """Enters the index key and the cache key; unique per compiler."""
    inductor_cache_subdirs: tuple[str, ...] = ()
    """Folders of Inductor's cache that this compiler's handles point into;
    they are kept in the kernel bundle (:mod:`fxpiece.piecewise.kernels`)."""
    load_uses_inputs: bool = True
    """Whether :meth:`load` reads ``example_inputs`` (or anything recorded
    on the graph's nodes); ``False`` lets a warm start skip making fake
    inputs of the backend's own fake mode, and load an ahead-of-time
    entry's light graph (recorded values only at piece boundaries)."""
    load_prepares_inductor: bool = False
    """Whether :meth:`load` calls ``ctx.inductor.prepare()`` itself before
    it uses Inductor's caches (``False``: the backend calls it before every
    load; it always does before :meth:`compile`)."""

    def compute_hash(self) -> str:
        """A hash of everything about this compiler that changes its output
        (version, build, options); enters the cache key."""
        return self.name

    @abstractmethod
    def compile(
        self,
        graph: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        entry: Range,
        ctx: CompileContext,
    ) -> CompileResult:
        """Compile ``graph`` for ``entry`` (symbolic shapes for a range,
        concrete ones for a single size)."""

    def load(
        self,
        handle: Any,
        graph: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        entry: Range,
        ctx: CompileContext,
    ) -> Callable[..., Any] | None:
        """Load a result from ``handle``; ``None`` means it is gone (compile
        again). The default cannot load anything."""
        return None

    @property
    def is_inductor(self) -> bool:
        """Whether compiles count as Inductor compiles."""
        return False
