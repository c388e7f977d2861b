"""Compile ranges: which token counts a compiled piece serves.

>>> from fxpiece.ranges import Range, ranges_from_endpoints
>>> ranges_from_endpoints([32, 8], max_num_tokens=8192)
(Range(1, 8), Range(9, 32), Range(33, 8192))
>>> Range(16, 16).is_single_size
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fxpiece.errors import ConfigError

__all__ = ["Range", "choose_entry", "compile_entries", "ranges_from_endpoints"]


@dataclass(frozen=True, slots=True, order=True)
class Range:
    """Token counts ``start..end``, both ends inclusive; ``Range(s, s)`` is one size."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not isinstance(self.start, int) or not isinstance(self.end, int):
            raise ConfigError("Range", f"ends must be ints, got {self.start!r}, {self.end!r}")
        if self.start < 1 or self.end < self.start:
            raise ConfigError(
                "Range", f"need 1 <= start <= end, got Range({self.start}, {self.end})"
            )

    @property
    def is_single_size(self) -> bool:
        return self.start == self.end

    def __contains__(self, size: object) -> bool:
        return isinstance(size, int) and self.start <= size <= self.end

    def __repr__(self) -> str:
        return f"Range({self.start}, {self.end})"

    def __str__(self) -> str:
        return str(self.start) if self.is_single_size else f"[{self.start},{self.end}]"


def ranges_from_endpoints(endpoints: Iterable[int], max_num_tokens: int) -> tuple[Range, ...]:
    """Ranges ``[prev+1, e]`` over sorted, deduplicated endpoints, the last
    one ending at ``max_num_tokens`` (endpoints above it are dropped)."""
    ends = sorted({e for e in endpoints if e < max_num_tokens})
    ends.append(max_num_tokens)
    out: list[Range] = []
    prev = 0
    for e in ends:
        out.append(Range(prev + 1, e))
        prev = e
    return tuple(out)


def compile_entries(ranges: Sequence[Range], sizes: Iterable[int]) -> tuple[Range, ...]:
    """Everything a piece is compiled for: the ranges, then each exact size
    that is not already a single-size range, in ascending order."""
    have = set(ranges)
    extra = sorted({Range(s, s) for s in sizes} - have)
    return tuple(ranges) + tuple(extra)


def choose_entry(entries: Sequence[Range], size: int) -> Range | None:
    """The entry serving ``size``: an exact size wins over a range; else the
    first range containing it; ``None`` if no entry does."""
    first: Range | None = None
    for r in entries:
        if r.is_single_size and r.start == size:
            return r
        if first is None and size in r:
            first = r
    return first
