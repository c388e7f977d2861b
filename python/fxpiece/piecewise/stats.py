"""What the backend did, as data: per piece, per graph, per backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fxpiece.counters import Counters
from fxpiece.ranges import Range

if TYPE_CHECKING:
    from fxpiece.piecewise.dispatch import PieceRunner

__all__ = ["BackendStats", "GraphStats", "PieceStats", "ProgressEvent"]


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


@dataclass
class BackendStats:
    """Counters, timings and split results of one backend."""

    counters: Counters = field(default_factory=Counters)
    graphs: list[GraphStats] = field(default_factory=list)

    @property
    def compile_s(self) -> float:
        return sum(g.compile_s for g in self.graphs)

    @property
    def load_s(self) -> float:
        return sum(g.load_s for g in self.graphs)

    @property
    def total_s(self) -> float:
        return sum(g.total_s for g in self.graphs)
