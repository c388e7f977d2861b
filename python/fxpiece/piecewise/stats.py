"""What the backend did, as data: per piece, per graph, per backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fxpiece.counters import Counters
from fxpiece.ranges import Range

if TYPE_CHECKING:
    from fxpiece.piecewise.dispatch import PieceRunner

__all__ = ["BackendStats", "GraphStats", "PieceStats", "ProgressEvent", "StartupBreakdown"]


@dataclass
class PieceStats:
    """What happened to one piece of one graph."""

    index: int
    name: str
    is_splitting_graph: bool
    split_op: str | None
    num_nodes: int
    entries: list[str] = field(default_factory=list)
    token_arg: str | None = None
    """Where the piece reads the token count it dispatches on (``"arg 2"``,
    ``"arg 0 dim 1"``); ``None``: it does not see it, one entry serves all."""
    compiled: int = 0
    """Entries compiled by the compiler (Inductor or eager)."""
    loaded: int = 0
    """Entries loaded from the cache."""
    reused: int = 0
    """Entries served by an identical piece compiled or loaded in this process."""
    compile_s: float = 0.0
    load_s: float = 0.0
    wait_s: float = 0.0
    """Time spent waiting for another process compiling this piece."""
    slot_wait_s: float = 0.0
    """Time spent waiting for a free compile slot on this host."""
    compile_intervals: list[tuple[float, float]] = field(default_factory=list)
    """``(start, end)`` wall-clock times (``time.time()``) of each compile,
    comparable across the processes of a host."""


@dataclass
class GraphStats:
    """One Dynamo graph handed to the backend."""

    cache_key: str | None
    cache_folder: Path | None
    pieces: list[PieceStats]
    split_s: float = 0.0
    key_s: float = 0.0
    compile_s: float = 0.0
    load_s: float = 0.0
    total_s: float = 0.0
    traced_files: int = 0
    token_symbol: str | None = None
    """The token count's symbol: the size of the first dim marked dynamic,
    else the first symbolic input size (``None``: static shapes)."""
    started_at: float = 0.0
    """``time.perf_counter()`` when the backend was handed this graph."""
    miss_explanation: str | None = None
    """Why the cache missed, when another key of the same model tag exists."""
    cache_problem: str | None = None
    """Why the cache could not be used for this graph (it ran uncached)."""
    runners: list[PieceRunner] = field(default_factory=list, repr=False)

    @property
    def num_pieces(self) -> int:
        return len(self.pieces)

    @property
    def num_compiled_pieces(self) -> int:
        return sum(1 for p in self.pieces if not p.is_splitting_graph)


@dataclass(frozen=True)
class ProgressEvent:
    """One (piece, entry) done: ``action`` is compiled, loaded or reused."""

    piece: int
    num_pieces: int
    entry: Range
    action: str
    seconds: float


@dataclass(frozen=True)
class StartupBreakdown:
    """Where a process's first call went (import excluded), in seconds.

    ``trace_s`` is the time from the call to the backend receiving the
    first graph: Dynamo's trace, or on an ahead-of-time start the launch
    key and the saved entry's load. The backend's share is split into
    ``key_s`` (cache key: hashing and factors), ``wait_s`` (waiting for
    other processes compiling the same piece, and for a compile slot),
    ``compile_s``, ``load_s`` and ``other_backend_s`` (split, plan, kernel
    bundle). ``first_run_s`` is the rest: running the compiled graph (and
    tracing any later graph of the same call)."""

    total_s: float
    trace_s: float
    key_s: float
    wait_s: float
    compile_s: float
    load_s: float
    other_backend_s: float
    first_run_s: float

    @classmethod
    def measure(cls, graphs: list[GraphStats], t0: float, t1: float) -> StartupBreakdown:
        """From the graphs built during the call that ran from ``t0`` to
        ``t1`` (``time.perf_counter()``)."""
        during = [g for g in graphs if t0 <= g.started_at <= t1]
        pieces = [p for g in during for p in g.pieces]
        backend = sum(g.total_s for g in during)
        key = sum(g.key_s for g in during)
        wait = sum(p.wait_s + p.slot_wait_s for p in pieces)
        comp = sum(p.compile_s for p in pieces)
        load = sum(p.load_s for p in pieces)
        trace = (min(g.started_at for g in during) - t0) if during else 0.0
        total = t1 - t0
        return cls(
            total_s=total,
            trace_s=trace,
            key_s=key,
            wait_s=wait,
            compile_s=comp,
            load_s=load,
            other_backend_s=max(0.0, backend - key - wait - comp - load),
            first_run_s=max(0.0, total - trace - backend),
        )

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in vars(self).items()}


@dataclass
class BackendStats:
    """Counters, timings and split results of one backend."""

    counters: Counters = field(default_factory=Counters)
    graphs: list[GraphStats] = field(default_factory=list)
    startup: StartupBreakdown | None = None
    """The first call's breakdown (set by :func:`fxpiece.compile`'s model)."""
    max_parallel_compiles: int | None = None
    """The compile slots per host this backend used (``None``: not yet known)."""

    @property
    def compile_s(self) -> float:
        return sum(g.compile_s for g in self.graphs)

    @property
    def load_s(self) -> float:
        return sum(g.load_s for g in self.graphs)

    @property
    def total_s(self) -> float:
        return sum(g.total_s for g in self.graphs)
