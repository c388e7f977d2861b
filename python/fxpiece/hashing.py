"""Cache-key hashing: BLAKE3 over sets of source files and over factor values.

>>> from fxpiece import hash_factors
>>> hash_factors({"a": 1}) == hash_factors({"a": 1})
True
>>> hash_factors({"a": 1}) != hash_factors({"a": "1"})
True
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from fxpiece import _native

__all__ = ["FileDigest", "FilesReport", "hash_factors", "hash_files", "hash_files_report"]

_log = logging.getLogger("fxpiece.hashing")

StrPath = str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class FileDigest:
    """One file of a hashed set: its BLAKE3 digest, or why it was skipped."""

    path: str
    digest: str | None
    size: int
    skipped: str | None


@dataclass(frozen=True, slots=True)
class FilesReport:
    """The digest over a set of files and the per-file results behind it."""

    digest: str
    files: tuple[FileDigest, ...]

    @property
    def skipped(self) -> tuple[FileDigest, ...]:
        return tuple(f for f in self.files if f.skipped is not None)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def hash_files_report(paths: Iterable[StrPath]) -> FilesReport:
    """Hash a set of files (parallel, GIL released); keep per-file digests.

    Order and duplicates do not matter. A file that cannot be read (deleted,
    ``<frozen posixpath>``, ``<string>``) is skipped, listed in ``skipped``,
    and still framed by its path so the digest stays deterministic.
    """
    digest, files = _native.hash_files_report(paths)
    return FilesReport(digest, tuple(FileDigest(*f) for f in files))


def hash_files(paths: Iterable[StrPath]) -> str:
    """BLAKE3 hex digest (64 chars) over a set of files.

    Unreadable files are skipped and logged at DEBUG level on the
    ``fxpiece.hashing`` logger; use :func:`hash_files_report` to get them.
    """
    if _log.isEnabledFor(logging.DEBUG):
        report = hash_files_report(paths)
        for f in report.skipped:
            _log.debug("hash_files: skipped %s: %s", f.path, f.skipped)
        return report.digest
    return _native.hash_files(paths)


def hash_factors(value: object) -> str:
    """BLAKE3 hex digest of a canonical encoding of a JSON-like value.

    Dict keys are sorted; ``None``, ``bool``, ``int``, ``float``, ``str``,
    ``bytes``, ``list``, ``tuple`` and ``dict`` are distinct types, so
    ``{"a": 1}`` and ``{"a": "1"}`` differ. Anything else raises ``TypeError``
    naming where it is inside the value.
    """
    return _native.hash_factors(value)
