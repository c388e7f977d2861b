"""The one scan of a cache root that every ``fxpiece cache`` verb starts from.

:func:`scan_cache` walks the root laid out by
:class:`~fxpiece.cache.layout.CacheLayout` without changing anything (but
with ``repair_indexes``): the model folders and the entries of their
indexes (read with ``CacheIndex(..., readonly=True)``), which artifact each
entry references, and the files under ``artifacts/`` sorted into live,
quarantined, being written and hostile (FIFOs, symlinks, folders, devices,
oversized files: never opened).

A native index reader opens its ``log-*``/``snap-*`` files without guarding
against FIFOs or symlinks to devices, so an index folder holding such a file
is not handed to it: the files are reported (and moved aside with
``repair_indexes``) instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxpiece.cache.entries import Entry, RawKey, decode_key
from fxpiece.cache.explain import read_factors
from fxpiece.cache.index import CacheIndex, IndexProblem, verify_index
from fxpiece.cache.keys import factors_key
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.safeio import file_kind
from fxpiece.cache.store import ARTIFACT_LIMIT, quarantine
from fxpiece.errors import CacheError

__all__ = [
    "ARTIFACT_FILE_LIMIT",
    "INDEX_FILE_LIMIT",
    "ArtifactFile",
    "IndexCheck",
    "ModelScan",
    "Ref",
    "Scan",
    "artifact_rel",
    "hostile_reason",
    "list_dir",
    "lstat",
    "model_key",
    "open_index",
    "remove_entries",
    "scan_cache",
]

ARTIFACT_FILE_LIMIT = ARTIFACT_LIMIT + 256
"""Largest artifact file (payload and header) read; bigger ones are hostile."""
INDEX_FILE_LIMIT = 1 << 30
"""Largest index file handed to the native reader; bigger ones are hostile."""


@dataclass(frozen=True, slots=True)
class ArtifactFile:
    """A file under ``<root>/artifacts``."""

    path: str
    """Relative to the cache root."""
    size: int
    mtime: float

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "mtime": self.mtime}


@dataclass(frozen=True, slots=True)
class IndexCheck:
    """One index folder checked by :func:`~fxpiece.cache.admin.verify_cache`."""

    folder: str
    """Relative to the cache root."""
    good_files: int
    problems: tuple[IndexProblem, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "good_files": self.good_files,
            "problems": [
                {"file": p.file, "reason": p.reason, "moved_to": p.moved_to} for p in self.problems
            ],
        }


@dataclass
class Ref:
    """An index entry that references an artifact."""

    model: str
    """``models/<key>/<tag>``."""
    index_dir: Path
    key: RawKey
    """As stored (see :func:`~fxpiece.cache.entries.decode_key`)."""
    value: Any
    blake3: str | None
    size: int | None

    def label(self) -> str:
        s, e, piece, compiler = decode_key(self.key).legacy_raw()
        return f"{self.model} [{s},{e}] piece {piece} {compiler}"


@dataclass
class ModelScan:
    """A model folder ``models/<key_dir>/<tag>`` and its index entries."""

    key_dir: str
    tag: str
    folder: Path
    entries: list[tuple[RawKey, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    index_problems: tuple[IndexProblem, ...] = ()

    @property
    def rel(self) -> str:
        return CacheLayout.model_rel(self.key_dir, self.tag)


@dataclass
class Scan:
    """Everything found under a cache root."""

    layout: CacheLayout
    models: list[ModelScan] = field(default_factory=list)
    artifacts: dict[str, ArtifactFile] = field(default_factory=dict)
    """Live artifacts (regular files), by path relative to the root."""
    quarantined: list[ArtifactFile] = field(default_factory=list)
    temps: list[ArtifactFile] = field(default_factory=list)
    hostile: dict[str, str] = field(default_factory=dict)
    """Paths under ``artifacts/`` that are no artifact at all -> why (never read)."""
    refs: dict[str, list[Ref]] = field(default_factory=dict)
    """Artifact path -> the index entries that reference it."""
    bad_handles: list[Ref] = field(default_factory=list)
    """Entries whose handle points outside ``artifacts/``."""
    checks: list[IndexCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.layout.root

    def rel(self, path: str | os.PathLike[str]) -> str:
        return Path(path).relative_to(self.root).as_posix()


# -- small helpers ----------------------------------------------------------------


def lstat(path: str | os.PathLike[str]) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def hostile_reason(st: os.stat_result, limit: int) -> str | None:
    """Why a file with this ``lstat`` must never be opened, or ``None``."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink (never followed)"
    if not stat.S_ISREG(st.st_mode):
        return f"is {file_kind(st.st_mode)}, not a regular file (never read)"
    if st.st_size > limit:
        return f"is {st.st_size} bytes, over the {limit}-byte limit (never read)"
    return None


def _not_a_folder(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink (not followed)"
    return f"is {file_kind(st.st_mode)}, not a folder (not read)"


def list_dir(folder: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    """The entries of a folder by name; none if it cannot be listed."""
    try:
        return sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []


@contextlib.contextmanager
def _collect_warnings(into: list[str]) -> Iterator[None]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    into.extend(str(w.message) for w in caught)


def open_index(index_dir: Path) -> CacheIndex:
    """A writable handle (its warnings are dropped: the scan reported them)."""
    with _collect_warnings([]):
        return CacheIndex(str(index_dir))


def remove_entries(refs: Sequence[Ref], indexes: dict[Path, CacheIndex]) -> int:
    """Remove the entries in ``refs`` unless another process replaced them."""
    removed = 0
    for r in refs:
        idx = indexes.get(r.index_dir)
        if idx is None:
            idx = indexes[r.index_dir] = open_index(r.index_dir)
        idx.refresh()
        if idx.get(r.key) == r.value and idx.remove(r.key):
            removed += 1
    return removed


def model_key(m: ModelScan) -> str:
    """The full key recomputed from the factors file, or the folder name
    when they are unreadable or do not match it."""
    try:
        key = factors_key(read_factors(m.folder))
    except (CacheError, ValueError, TypeError):
        return m.key_dir
    return key if key.startswith(m.key_dir) else m.key_dir


# -- artifacts ------------------------------------------------------------------


def _scan_artifacts(scan: Scan) -> None:
    top = scan.layout.artifacts_dir
    st = lstat(top)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        scan.hostile[scan.rel(top)] = _not_a_folder(st)
        return
    for shard in list_dir(top):
        if shard.is_symlink():
            scan.hostile[scan.rel(shard.path)] = "is a symlink (never followed)"
        elif shard.is_dir(follow_symlinks=False):
            for ent in list_dir(shard.path):
                _sort_artifact(scan, ent)


def _sort_artifact(scan: Scan, ent: os.DirEntry[str]) -> None:
    st = lstat(ent.path)
    if st is None:
        return
    rel = scan.rel(ent.path)
    f = ArtifactFile(rel, st.st_size, st.st_mtime)
    if CacheLayout.is_temp(ent.name):
        scan.temps.append(f)
    elif CacheLayout.is_quarantined(ent.name):
        scan.quarantined.append(f)
    elif (why := hostile_reason(st, ARTIFACT_FILE_LIMIT)) is not None:
        scan.hostile[rel] = why
    else:
        scan.artifacts[rel] = f


# -- models and their indexes -----------------------------------------------------


def _scan_models(scan: Scan) -> None:
    for k in list_dir(scan.layout.models_dir):
        if k.is_symlink():
            scan.problems.append(f"{scan.rel(k.path)} is a symlink (not followed)")
            continue
        if not k.is_dir(follow_symlinks=False):
            continue
        for t in list_dir(k.path):
            if t.is_dir(follow_symlinks=False):
                scan.models.append(ModelScan(k.name, t.name, Path(t.path)))
            elif t.is_symlink():
                scan.problems.append(f"{scan.rel(t.path)} is a symlink (not followed)")


def _hostile_index_files(index_dir: Path, repair: bool) -> list[IndexProblem]:
    """Index files that are not regular files of sane size (moved aside
    with ``repair``): the native reader must never open them."""
    out: list[IndexProblem] = []
    for ent in list_dir(index_dir):
        st = lstat(ent.path) if CacheLayout.is_index_file(ent.name) else None
        why = hostile_reason(st, INDEX_FILE_LIMIT) if st is not None else None
        if why is not None:
            aside = quarantine(Path(ent.path)) if repair else None
            out.append(IndexProblem(ent.path, why, str(aside) if aside else None))
    return out


def _scan_index(scan: Scan, m: ModelScan, repair: bool) -> None:
    index_dir = scan.layout.index_dir(m.folder)
    st = lstat(index_dir)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        m.problems.append(f"index {_not_a_folder(st)}")
        return
    folder = scan.rel(index_dir)
    hostile = _hostile_index_files(index_dir, repair)
    if any(p.moved_to is None for p in hostile):
        m.problems.append(
            "index not read: it holds a file that is not a regular index file (see above); "
            "`fxpiece cache verify --repair` moves it aside"
        )
        m.index_problems = tuple(hostile)
        scan.checks.append(IndexCheck(folder, 0, m.index_problems))
        return
    caught: list[str] = []
    try:
        rep = verify_index(index_dir, repair=repair)
        with _collect_warnings(caught):
            m.entries = CacheIndex(str(index_dir), readonly=True).entries()
    except CacheError as e:
        rep = None
        hostile.append(IndexProblem(str(index_dir), f"unreadable: {e.strerror or e}", None))
    m.index_problems = (*hostile, *(rep.problems if rep else ()))
    scan.checks.append(IndexCheck(folder, rep.good_files if rep else 0, m.index_problems))
    # Warnings about files the verify report already names are not repeated.
    files = [p.file for p in m.index_problems]
    m.problems.extend(w for w in caught if rep and not any(f in w for f in files))


def _artifact_of(value: Any) -> tuple[str | None, str | None, int | None] | None:
    """``(relpath, blake3, size)`` of an entry whose handle has an artifact;
    ``None`` if it has none; relpath ``None`` if the handle is unsafe."""
    entry = Entry.from_raw(value)
    if entry is None or not entry.names_artifact:
        return None
    b3, size = entry.handle.get("blake3"), entry.handle.get("size")
    return (
        entry.artifact,
        b3 if isinstance(b3, str) else None,
        size if isinstance(size, int) and not isinstance(size, bool) else None,
    )


def artifact_rel(value: Any) -> str | None:
    """The artifact an index entry's handle references (safe paths only)."""
    art = _artifact_of(value)
    return art[0] if art else None


def _collect_refs(scan: Scan, m: ModelScan) -> None:
    index_dir = scan.layout.index_dir(m.folder)
    for key, value in m.entries:
        art = _artifact_of(value)
        if art is None:
            continue
        rel, b3, size = art
        ref = Ref(m.rel, index_dir, key, value, b3, size)
        if rel is None:
            scan.bad_handles.append(ref)
        else:
            scan.refs.setdefault(rel, []).append(ref)


def scan_cache(root: str | os.PathLike[str], *, repair_indexes: bool = False) -> Scan:
    """Scan the cache at ``root``; changes nothing unless ``repair_indexes``
    (then bad index files are moved aside, never deleted)."""
    layout = CacheLayout(root)
    if not layout.root.is_dir():
        raise CacheError(errno.ENOENT, f"no fxpiece cache at {layout.root}", str(layout.root))
    scan = Scan(layout)
    _scan_artifacts(scan)
    _scan_models(scan)
    for m in scan.models:
        _scan_index(scan, m, repair_indexes)
        _collect_refs(scan, m)
    return scan
