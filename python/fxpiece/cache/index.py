"""The shared cache index (see README, "The cache index").

>>> import tempfile, os
>>> from fxpiece import CacheIndex
>>> d = tempfile.mkdtemp()
>>> idx = CacheIndex(os.path.join(d, "index"))
>>> idx.insert((1, 8, 0, "inductor"), {"artifact": "artifacts/ab/abcd"})
>>> CacheIndex(os.path.join(d, "index")).get((1, 8, 0, "inductor"))
{'artifact': 'artifacts/ab/abcd'}
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fxpiece import _native
from fxpiece._native import CacheIndex, verify_index_file, write_atomic

__all__ = [
    "CacheIndex",
    "IndexProblem",
    "VerifyReport",
    "verify_index",
    "verify_index_file",
    "write_atomic",
]


@dataclass(frozen=True, slots=True)
class IndexProblem:
    """A file of an index that failed verification."""

    file: str
    reason: str
    moved_to: str | None


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Outcome of :func:`verify_index`."""

    good_files: int
    problems: tuple[IndexProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_index(path: str | os.PathLike[str], *, repair: bool = False) -> VerifyReport:
    """Check every file of the index folder at ``path``.

    With ``repair=True`` bad files are moved aside to ``*.corrupt-<time>``
    (never deleted), so their entries count as missing and get recompiled.
    """
    good, problems = _native.verify_index(path, repair=repair)
    return VerifyReport(good, tuple(IndexProblem(*p) for p in problems))
