"""Operating the cache: list, verify (and repair), prune, pack and unpack.

The functions behind ``fxpiece cache ...``. Each returns data (frozen
dataclasses with ``as_dict()`` for JSON) and prints nothing. None of them
imports torch. See :mod:`fxpiece.cache.store` for the layout::

    <root>/artifacts/<2 hex>/<digest>   compiled pieces (content-addressed)
    <root>/models/<key>/<tag>/index/    CacheIndex -> {"digest", "handle": {"artifact", ...}}
    <root>/locks/<digest>.lease         compile leases (fxpiece.cache.lease)
    <root>/inductor/                    Inductor's own cache

>>> import tempfile, pathlib
>>> from fxpiece.cache.admin import list_cache
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> listing = list_cache(root)
>>> len(listing.models), listing.total_artifact_bytes
(0, 0)
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import posixpath
import secrets
import shutil
import stat
import tarfile
import tempfile
import time
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxpiece.errors import CacheError
from fxpiece.cache.keys import factors_key
from fxpiece.cache.layout import FACTORS_FILE
from fxpiece.hashing import hash_files_report
from fxpiece.cache.index import (
    CacheIndex,
    IndexProblem,
    VerifyReport,
    verify_index,
    verify_index_file,
)
from fxpiece.cache.lease import DEFAULT_LEASE_TTL, Lease, read_lease
from fxpiece.cache.store import quarantine

__all__ = [
    "PACK_FORMAT",
    "PACK_VERSION",
    "ArchiveError",
    "ArtifactFile",
    "ArtifactProblem",
    "CacheListing",
    "CacheVerifyReport",
    "EntryInfo",
    "IndexCheck",
    "ModelInfo",
    "PackResult",
    "PruneItem",
    "PruneResult",
    "UnpackResult",
    "list_cache",
    "pack_cache",
    "prune_cache",
    "unpack_cache",
    "verify_cache",
]

PACK_FORMAT = "fxpiece-cache"
PACK_VERSION = 1
MANIFEST = "manifest.json"
_PACKED_TOPS = ("artifacts", "models")
_UNPACK_TOPS = ("artifacts", "models", "inductor")

Key = tuple[int, int, int, str]


class ArchiveError(CacheError):
    """A cache archive is malformed, unsafe (absolute paths, ``..``, links)
    or does not match its manifest; nothing was written."""


# -- data -------------------------------------------------------------------


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
class EntryInfo:
    """One index entry: a (range, piece, compiler) and what serves it."""

    start: int
    end: int
    piece: int
    compiler: str
    digest: str | None
    artifact: str | None
    """Relative path of the artifact, for handles that have one (``inductor``)."""
    size: int | None
    """Bytes of the artifact on disk (``None``: no artifact, or missing)."""

    @property
    def range(self) -> str:
        return f"[{self.start},{self.end}]"

    def as_dict(self) -> dict[str, Any]:
        return {
            "range": [self.start, self.end],
            "piece": self.piece,
            "compiler": self.compiler,
            "digest": self.digest,
            "artifact": self.artifact,
            "size": self.size,
        }


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model folder ``models/<key>/<tag>``."""

    key: str
    """The full key (recomputed from ``cache_key_factors.json``), or the
    folder name (its first 32 hex digits) when the factors are unreadable."""
    tag: str
    folder: Path
    entries: tuple[EntryInfo, ...]
    artifact_bytes: int
    """Bytes on disk of the distinct artifacts its entries reference."""
    missing_artifacts: int
    last_use: float | None
    """Newest mtime of the artifacts it references (loading touches them);
    for a model without artifacts, of its index files."""
    problems: tuple[str, ...] = ()

    @property
    def pieces(self) -> tuple[int, ...]:
        return tuple(sorted({e.piece for e in self.entries}))

    @property
    def ranges(self) -> tuple[str, ...]:
        return tuple(f"[{s},{e}]" for s, e in sorted({(e.start, e.end) for e in self.entries}))

    @property
    def compilers(self) -> tuple[str, ...]:
        return tuple(sorted({e.compiler for e in self.entries}))

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "tag": self.tag,
            "folder": str(self.folder),
            "entries": [e.as_dict() for e in self.entries],
            "num_entries": len(self.entries),
            "pieces": list(self.pieces),
            "ranges": list(self.ranges),
            "compilers": list(self.compilers),
            "artifact_bytes": self.artifact_bytes,
            "missing_artifacts": self.missing_artifacts,
            "last_use": self.last_use,
            "problems": list(self.problems),
        }


@dataclass(frozen=True, slots=True)
class CacheListing:
    """What :func:`list_cache` found."""

    root: Path
    models: tuple[ModelInfo, ...]
    artifacts: tuple[ArtifactFile, ...]
    orphans: tuple[ArtifactFile, ...]
    """Artifacts no index entry references (never loaded; pruned first)."""
    quarantined: tuple[ArtifactFile, ...]
    """Bad artifacts moved aside (``*.corrupt-<time>``); kept for inspection."""
    temps: tuple[ArtifactFile, ...]
    """Artifacts being written (``.tmp-*``)."""
    inductor_bytes: int
    problems: tuple[str, ...] = ()

    @property
    def total_artifact_bytes(self) -> int:
        return sum(a.size for a in self.artifacts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "models": [m.as_dict() for m in self.models],
            "num_artifacts": len(self.artifacts),
            "total_artifact_bytes": self.total_artifact_bytes,
            "orphans": [a.as_dict() for a in self.orphans],
            "quarantined": [a.as_dict() for a in self.quarantined],
            "temps": [a.as_dict() for a in self.temps],
            "inductor_bytes": self.inductor_bytes,
            "problems": list(self.problems),
        }


@dataclass(frozen=True, slots=True)
class IndexCheck:
    """One index folder checked by :func:`verify_cache`."""

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


@dataclass(frozen=True, slots=True)
class ArtifactProblem:
    """An artifact referenced by an index that is missing or bad."""

    artifact: str
    reason: str
    referenced_by: tuple[str, ...]
    """``models/<key>/<tag> [start,end] piece N compiler`` of each entry."""
    moved_to: str | None = None
    """Where ``--repair`` moved it (relative to the root); never deleted."""
    entries_removed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact,
            "reason": self.reason,
            "referenced_by": list(self.referenced_by),
            "moved_to": self.moved_to,
            "entries_removed": self.entries_removed,
        }


@dataclass(frozen=True, slots=True)
class CacheVerifyReport:
    """What :func:`verify_cache` found (and repaired)."""

    root: Path
    repaired: bool
    indexes: tuple[IndexCheck, ...]
    artifacts_checked: int
    artifact_bytes: int
    problems: tuple[ArtifactProblem, ...]
    unreferenced: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    """Findings that do not make the cache unusable (e.g. a factors file that
    does not match its key folder)."""

    @property
    def index_problems(self) -> int:
        return sum(len(i.problems) for i in self.indexes)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.index_problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "ok": self.ok,
            "repaired": self.repaired,
            "indexes": [i.as_dict() for i in self.indexes],
            "artifacts_checked": self.artifacts_checked,
            "artifact_bytes": self.artifact_bytes,
            "problems": [p.as_dict() for p in self.problems],
            "unreferenced": list(self.unreferenced),
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, slots=True)
class PruneItem:
    """An artifact :func:`prune_cache` removed, or wanted to and kept."""

    artifact: str
    size: int
    mtime: float
    reason: str
    entries_removed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact,
            "size": self.size,
            "mtime": self.mtime,
            "reason": self.reason,
            "entries_removed": self.entries_removed,
        }


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What :func:`prune_cache` removed and kept, and why."""

    root: Path
    dry_run: bool
    max_size: int | None
    older_than: float | None
    bytes_before: int
    bytes_after: int
    removed: tuple[PruneItem, ...]
    kept: tuple[PruneItem, ...]
    """Artifacts that should have gone but are in use (a live lease, being
    written, or used during the prune)."""

    @property
    def size_target_met(self) -> bool:
        return self.max_size is None or self.bytes_after <= self.max_size

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "dry_run": self.dry_run,
            "max_size": self.max_size,
            "older_than": self.older_than,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "size_target_met": self.size_target_met,
            "removed": [r.as_dict() for r in self.removed],
            "kept": [k.as_dict() for k in self.kept],
        }


@dataclass(frozen=True, slots=True)
class PackResult:
    """The archive :func:`pack_cache` wrote."""

    archive: Path
    files: int
    bytes: int
    """Total size of the packed files (before compression)."""
    archive_bytes: int
    skipped: tuple[str, ...] = ()
    """Paths left out: symlinks (never followed) and unreadable files."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "archive": str(self.archive),
            "files": self.files,
            "bytes": self.bytes,
            "archive_bytes": self.archive_bytes,
            "skipped": list(self.skipped),
        }


@dataclass(frozen=True, slots=True)
class UnpackResult:
    """What :func:`unpack_cache` wrote."""

    root: Path
    written: int
    unchanged: int
    """Files already present with the same content."""
    bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "written": self.written,
            "unchanged": self.unchanged,
            "bytes": self.bytes,
        }


# -- scanning ---------------------------------------------------------------


@dataclass
class _Ref:
    """An index entry that references an artifact."""

    model: str  # models/<key>/<tag>
    index_dir: Path
    key: Key
    value: Any
    blake3: str | None
    size: int | None

    def label(self) -> str:
        s, e, piece, compiler = self.key
        return f"{self.model} [{s},{e}] piece {piece} {compiler}"


@dataclass
class _Model:
    key_dir: str
    tag: str
    folder: Path
    entries: list[tuple[Key, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    index_problems: tuple[IndexProblem, ...] = ()


@dataclass
class _Scan:
    root: Path
    models: list[_Model]
    artifacts: dict[str, ArtifactFile]
    quarantined: list[ArtifactFile]
    temps: list[ArtifactFile]
    refs: dict[str, list[_Ref]]
    bad_handles: list[_Ref]
    problems: list[str]


def _is_temp(name: str) -> bool:
    return name.startswith(".tmp")


def _is_quarantined(name: str) -> bool:
    return ".corrupt-" in name


def _scan_artifacts(
    root: Path, problems: list[str]
) -> tuple[dict[str, ArtifactFile], list[ArtifactFile], list[ArtifactFile]]:
    live: dict[str, ArtifactFile] = {}
    quarantined: list[ArtifactFile] = []
    temps: list[ArtifactFile] = []
    top = root / "artifacts"
    try:
        shards = sorted(os.scandir(top), key=lambda e: e.name)
    except FileNotFoundError:
        return live, quarantined, temps
    for shard in shards:
        if not shard.is_dir(follow_symlinks=False):
            if shard.is_symlink():
                problems.append(f"artifacts/{shard.name} is a symlink (not followed)")
            continue
        for ent in sorted(os.scandir(shard.path), key=lambda e: e.name):
            rel = f"artifacts/{shard.name}/{ent.name}"
            try:
                st = ent.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                if stat.S_ISLNK(st.st_mode):
                    problems.append(f"{rel} is a symlink (not followed)")
                continue
            f = ArtifactFile(rel, st.st_size, st.st_mtime)
            if _is_temp(ent.name):
                temps.append(f)
            elif _is_quarantined(ent.name):
                quarantined.append(f)
            else:
                live[rel] = f
    return live, quarantined, temps


def _model_folders(root: Path, problems: list[str]) -> list[_Model]:
    out: list[_Model] = []
    try:
        keys = sorted(os.scandir(root / "models"), key=lambda e: e.name)
    except FileNotFoundError:
        return out
    for k in keys:
        if not k.is_dir(follow_symlinks=False):
            if k.is_symlink():
                problems.append(f"models/{k.name} is a symlink (not followed)")
            continue
        for t in sorted(os.scandir(k.path), key=lambda e: e.name):
            if t.is_dir(follow_symlinks=False):
                out.append(_Model(k.name, t.name, Path(t.path)))
            elif t.is_symlink():
                problems.append(f"models/{k.name}/{t.name} is a symlink (not followed)")
    return out


@contextlib.contextmanager
def _collect_warnings(into: list[str]) -> Iterator[None]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    into.extend(str(w.message) for w in caught)


def _open_index(index_dir: Path, problems: list[str]) -> CacheIndex:
    with _collect_warnings(problems):
        return CacheIndex(str(index_dir))


def _read_entries(
    index_dir: Path, report: VerifyReport | None, problems: list[str]
) -> list[tuple[Key, Any]]:
    """The entries of an index without changing it: if some of its files are
    corrupt (which opening it would move aside), read a copy of the good ones."""
    if report is None:
        return []
    if report.ok:
        return list(_open_index(index_dir, problems).entries())
    bad = {os.path.basename(p.file) for p in report.problems}
    with tempfile.TemporaryDirectory(prefix="fxpiece-index-") as tmp:
        for name in os.listdir(index_dir):
            src = index_dir / name
            if name in bad or not (name.startswith(("log-", "snap-")) and src.is_file()):
                continue
            try:
                verify_index_file(src)
                shutil.copyfile(src, os.path.join(tmp, name))
            except (CacheError, OSError):
                continue
        with _collect_warnings([]):
            return list(CacheIndex(tmp, use_flock=False).entries())


def _artifact_of(value: Any) -> tuple[str | None, str | None, int | None] | None:
    """``(relpath, blake3, size)`` of an entry whose handle has an artifact;
    ``None`` if it has none; relpath ``None`` if the handle is unsafe."""
    if not isinstance(value, Mapping):
        return None
    handle = value.get("handle")
    if not isinstance(handle, Mapping) or "artifact" not in handle:
        return None
    rel = handle.get("artifact")
    b3 = handle.get("blake3")
    size = handle.get("size")
    safe = isinstance(rel, str) and _safe_relpath(rel) and rel.startswith("artifacts/")
    return (
        rel if safe else None,
        b3 if isinstance(b3, str) else None,
        size if isinstance(size, int) and not isinstance(size, bool) else None,
    )


def _scan(root: Path, *, repair_indexes: bool = False) -> tuple[_Scan, list[IndexCheck]]:
    root = Path(root)
    if not root.is_dir():
        raise CacheError(errno.ENOENT, f"no fxpiece cache at {root}", str(root))
    problems: list[str] = []
    artifacts, quarantined, temps = _scan_artifacts(root, problems)
    models = _model_folders(root, problems)
    checks: list[IndexCheck] = []
    refs: dict[str, list[_Ref]] = {}
    bad: list[_Ref] = []
    for m in models:
        index_dir = m.folder / "index"
        rel_model = f"models/{m.key_dir}/{m.tag}"
        rep: VerifyReport | None = None
        if index_dir.is_dir() and not index_dir.is_symlink():
            rep = verify_index(index_dir, repair=repair_indexes)
            checks.append(IndexCheck(f"{rel_model}/index", rep.good_files, rep.problems))
            m.index_problems = rep.problems
        elif index_dir.is_symlink():
            m.problems.append("index is a symlink (not followed)")
        if repair_indexes and rep is not None:
            m.entries = list(_open_index(index_dir, m.problems).entries())
        else:
            m.entries = _read_entries(index_dir, rep, m.problems)
        for key, value in m.entries:
            art = _artifact_of(value)
            if art is None:
                continue
            rel, b3, size = art
            ref = _Ref(rel_model, index_dir, key, value, b3, size)
            if rel is None:
                bad.append(ref)
            else:
                refs.setdefault(rel, []).append(ref)
    return _Scan(root, models, artifacts, quarantined, temps, refs, bad, problems), checks


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _model_key(m: _Model) -> str:
    try:
        with open(m.folder / FACTORS_FILE, encoding="utf-8") as f:
            factors = json.load(f)
        key = factors_key(factors)
    except (OSError, ValueError, TypeError):
        return m.key_dir
    return key if key.startswith(m.key_dir) else m.key_dir


# -- ls -----------------------------------------------------------------------


def list_cache(root: str | os.PathLike[str]) -> CacheListing:
    """Every model folder (key, tag, entries, pieces, ranges, compilers,
    bytes of the artifacts it references, last use), the artifacts, the
    orphans (artifacts no entry references) and quarantined files.

    Listing does not repair anything: an index with corrupt files is read
    from a copy of its good files (``verify --repair`` moves them aside).
    Like every index reader, it removes temp files left by dead writers."""
    scan, _ = _scan(Path(root))
    models: list[ModelInfo] = []
    for m in scan.models:
        entries: list[EntryInfo] = []
        used: dict[str, ArtifactFile] = {}
        missing: set[str] = set()
        for key, value in sorted(m.entries, key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
            art = _artifact_of(value)
            rel = art[0] if art else None
            on_disk = scan.artifacts.get(rel) if rel else None
            if rel and on_disk is None:
                missing.add(rel)
            if rel and on_disk is not None:
                used[rel] = on_disk
            digest = value.get("digest") if isinstance(value, Mapping) else None
            entries.append(
                EntryInfo(
                    key[0],
                    key[1],
                    key[2],
                    key[3],
                    digest if isinstance(digest, str) else None,
                    rel,
                    on_disk.size if on_disk else None,
                )
            )
        # Loading touches an artifact; index files change on compiles (and
        # removals), so they only date models without artifacts.
        times = [a.mtime for a in used.values()]
        if not times:
            with contextlib.suppress(OSError):
                for ent in os.scandir(m.folder / "index"):
                    if ent.name.startswith(("log-", "snap-")):
                        times.append(ent.stat(follow_symlinks=False).st_mtime)
        models.append(
            ModelInfo(
                key=_model_key(m),
                tag=m.tag,
                folder=m.folder,
                entries=tuple(entries),
                artifact_bytes=sum(a.size for a in used.values()),
                missing_artifacts=len(missing),
                last_use=max(times) if times else _mtime(m.folder / FACTORS_FILE),
                problems=(*(f"{p.file}: {p.reason}" for p in m.index_problems), *m.problems),
            )
        )
    models.sort(key=lambda mi: -(mi.last_use or 0.0))
    orphans = tuple(a for rel, a in sorted(scan.artifacts.items()) if rel not in scan.refs)
    ind = scan.root / "inductor"
    return CacheListing(
        root=scan.root,
        models=tuple(models),
        artifacts=tuple(a for _, a in sorted(scan.artifacts.items())),
        orphans=orphans,
        quarantined=tuple(scan.quarantined),
        temps=tuple(scan.temps),
        inductor_bytes=_dir_bytes(ind) if ind.is_dir() and not ind.is_symlink() else 0,
        problems=tuple(scan.problems),
    )


# -- verify ---------------------------------------------------------------------


def _remove_entries(refs: Sequence[_Ref], indexes: dict[Path, CacheIndex]) -> int:
    """Remove the entries in ``refs`` unless another process replaced them."""
    removed = 0
    for r in refs:
        idx = indexes.get(r.index_dir)
        if idx is None:
            idx = indexes[r.index_dir] = _open_index(r.index_dir, [])
        idx.refresh()
        if idx.get(r.key) == r.value and idx.remove(r.key):
            removed += 1
    return removed


def _check_artifact(
    path: Path, st: os.stat_result | None, digest: str | None, refs: Sequence[_Ref]
) -> str | None:
    """Why the artifact at ``path`` is bad, or ``None``."""
    if st is None:
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink (never followed)"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    for r in refs:
        if r.size is not None and st.st_size != r.size:
            if st.st_size == 0:
                return f"empty (0 bytes), expected {r.size} bytes"
            return f"size {st.st_size} bytes, expected {r.size} (truncated or overwritten)"
    if digest is None:
        return "unreadable"
    for r in refs:
        if r.blake3 is None:
            return "its index entry has no checksum"
        if digest != r.blake3:
            return f"checksum mismatch (BLAKE3 {digest[:12]}.., expected {r.blake3[:12]}..)"
    return None


def verify_cache(root: str | os.PathLike[str], repair: bool = False) -> CacheVerifyReport:
    """Check every index (``verify_index``) and every artifact an index
    references (exists, size, BLAKE3 against the handle); list unreferenced
    artifacts.

    With ``repair=True``: corrupt index files and bad artifacts are moved
    aside (``*.corrupt-<unix time>``, never deleted) and the index entries
    pointing to bad or missing artifacts are removed, so the next run
    recompiles exactly those. Without it nothing is moved or removed (but
    the temp files of dead writers, which every index reader cleans up).
    """
    scan, checks = _scan(Path(root), repair_indexes=repair)
    root_p = scan.root
    paths = sorted(scan.refs)
    stats: dict[str, os.stat_result | None] = {}
    for rel in paths:
        try:
            stats[rel] = os.lstat(root_p / rel)
        except OSError:
            stats[rel] = None
    hashable = [str(root_p / rel) for rel in paths if _is_reg(stats[rel])]
    digests = {f.path: f.digest for f in hash_files_report(hashable).files} if hashable else {}
    problems: list[ArtifactProblem] = []
    indexes: dict[Path, CacheIndex] = {}
    checked_bytes = 0
    for rel in paths:
        refs = scan.refs[rel]
        path = root_p / rel
        st = stats[rel]
        if st is not None and _is_reg(st):
            checked_bytes += st.st_size
        reason = _check_artifact(path, st, digests.get(str(path)), refs)
        if reason is None:
            continue
        moved: str | None = None
        removed = 0
        if repair:
            if st is not None:
                # Re-check first: another process may have rewritten it meanwhile.
                again = hash_files_report([str(path)]).files
                st2 = _lstat(path)
                if _check_artifact(path, st2, again[0].digest if again else None, refs) is None:
                    continue
                aside = quarantine(path)
                moved = str(aside.relative_to(root_p)) if aside else None
            removed = _remove_entries(refs, indexes)
        problems.append(
            ArtifactProblem(rel, reason, tuple(r.label() for r in refs), moved, removed)
        )
    for r in scan.bad_handles:
        removed = _remove_entries([r], indexes) if repair else 0
        problems.append(
            ArtifactProblem(
                str(r.value.get("handle", {}).get("artifact")),
                "the handle points outside <root>/artifacts (refused)",
                (r.label(),),
                None,
                removed,
            )
        )
    notes = list(scan.problems)
    for m in scan.models:
        notes.extend(f"models/{m.key_dir}/{m.tag}: {p}" for p in m.problems)
        if (m.folder / FACTORS_FILE).is_file() and _model_key(m) == m.key_dir:
            notes.append(
                f"models/{m.key_dir}/{m.tag}/{FACTORS_FILE} is unreadable or does not match "
                "its key folder (the next run rewrites it; `fxpiece cache explain` may "
                "mislead until then)"
            )
    unreferenced = tuple(rel for rel in sorted(scan.artifacts) if rel not in scan.refs)
    return CacheVerifyReport(
        root=root_p,
        repaired=repair,
        indexes=tuple(checks),
        artifacts_checked=len(paths),
        artifact_bytes=checked_bytes,
        problems=tuple(problems),
        unreferenced=unreferenced,
        warnings=tuple(notes),
    )


def _is_reg(st: os.stat_result | None) -> bool:
    return st is not None and stat.S_ISREG(st.st_mode)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


# -- prune ----------------------------------------------------------------------


def _live_lease(root: Path, rel: str) -> str | None:
    """Who holds a live compile lease on the artifact's digest, if anyone."""
    digest = posixpath.basename(rel)
    info = read_lease(str(root / "locks" / f"{digest}.lease"))
    if info is None or Lease.is_stale(info, ttl=DEFAULT_LEASE_TTL):
        return None
    who = f"{info.host} pid {info.pid}" if info.token else "a lease being written"
    return f"in use: compile lease held by {who}"


def prune_cache(
    root: str | os.PathLike[str],
    max_size: int | None = None,
    older_than: float | None = None,
    now: float | None = None,
    *,
    dry_run: bool = False,
) -> PruneResult:
    """Remove artifacts, least recently used first (artifact mtime; loading
    touches it), and the index entries pointing to them: until the artifacts
    total at most ``max_size`` bytes, and every artifact unused for more than
    ``older_than`` seconds. Artifacts no entry references go first.

    Never removes an artifact whose digest has a live compile lease
    (``locks/<digest>.lease`` not stale), one used while pruning, nor a
    ``.tmp-*`` file being written; quarantined files are left for the user.
    """
    if max_size is None and older_than is None:
        raise ValueError("prune_cache needs max_size or older_than")
    if max_size is not None and max_size < 0:
        raise ValueError(f"max_size must be >= 0, got {max_size}")
    if older_than is not None and older_than < 0:
        raise ValueError(f"older_than must be >= 0, got {older_than}")
    scan, _ = _scan(Path(root))
    root_p = scan.root
    now = time.time() if now is None else now
    total = sum(a.size for a in scan.artifacts.values())
    before = total
    order = sorted(scan.artifacts.values(), key=lambda a: (a.path in scan.refs, a.mtime, a.path))
    removed: list[PruneItem] = []
    kept: list[PruneItem] = [
        PruneItem(t.path, t.size, t.mtime, "being written (.tmp file)") for t in scan.temps
    ]
    indexes: dict[Path, CacheIndex] = {}
    for a in order:
        old = older_than is not None and now - a.mtime > older_than
        big = max_size is not None and total > max_size
        if not (old or big):
            continue
        why = "older than the limit" if old else "least recently used, over the size limit"
        if a.path not in scan.refs:
            why = f"unreferenced; {why}"
        held = _live_lease(root_p, a.path)
        if held is not None:
            kept.append(PruneItem(a.path, a.size, a.mtime, held))
            continue
        path = root_p / a.path
        st = _lstat(path)
        if st is None:
            total -= a.size  # already gone
            continue
        if st.st_mtime > a.mtime:
            kept.append(PruneItem(a.path, a.size, st.st_mtime, "used while pruning"))
            continue
        if dry_run:
            removed.append(PruneItem(a.path, a.size, a.mtime, why, len(scan.refs.get(a.path, []))))
            total -= a.size
            continue
        n = _remove_entries(scan.refs.get(a.path, []), indexes)
        held = _live_lease(root_p, a.path)  # a compile may have started meanwhile
        if held is not None:
            kept.append(PruneItem(a.path, a.size, a.mtime, held, n))
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        total -= a.size
        removed.append(PruneItem(a.path, a.size, a.mtime, why, n))
    return PruneResult(
        root=root_p,
        dry_run=dry_run,
        max_size=max_size,
        older_than=older_than,
        bytes_before=before,
        bytes_after=total,
        removed=tuple(removed),
        kept=tuple(kept),
    )


# -- pack / unpack ------------------------------------------------------------


def _safe_relpath(name: str) -> bool:
    """A normalized relative POSIX path inside its root: no ``..``, not
    absolute, no empty, ``.`` or hidden parts, no backslashes or NULs."""
    if not name or "\\" in name or "\x00" in name or name.startswith("/"):
        return False
    if posixpath.normpath(name) != name:
        return False
    return all(part and part != ".." and not part.startswith(".") for part in name.split("/"))


def _excluded(name: str) -> bool:
    """Files a pack leaves out: temps, locks, leases, quarantined files."""
    return (
        name.startswith(".")
        or name == "LOCK"
        or name.endswith((".lock", ".lease"))
        or ".corrupt-" in name
        or ".stale-" in name
    )


def _pack_files(root: Path, tops: Iterable[str], skipped: list[str]) -> list[str]:
    out: list[str] = []
    for top in tops:
        base = root / top
        if base.is_symlink():
            skipped.append(f"{top} (symlink)")
            continue
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            rel_dir = Path(dirpath).relative_to(root).as_posix()
            keep = []
            for d in sorted(dirnames):
                if os.path.islink(os.path.join(dirpath, d)):
                    skipped.append(f"{rel_dir}/{d} (symlink)")
                elif d != "locks" and not d.startswith("."):
                    keep.append(d)
            dirnames[:] = keep
            for name in sorted(filenames):
                rel = f"{rel_dir}/{name}"
                if _excluded(name):
                    continue
                st = _lstat(Path(dirpath) / name)
                if st is None:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    skipped.append(
                        f"{rel} ({'symlink' if stat.S_ISLNK(st.st_mode) else 'special'})"
                    )
                elif not _safe_relpath(rel):
                    skipped.append(f"{rel} (unsafe name)")
                else:
                    out.append(rel)
    return out


def _tar_mode(path: Path, writing: bool) -> str:
    name = path.name.lower()
    comp = ""
    if name.endswith((".tar.gz", ".tgz")):
        comp = "gz"
    elif name.endswith((".tar.bz2", ".tbz2")):
        comp = "bz2"
    elif name.endswith((".tar.xz", ".txz")):
        comp = "xz"
    if writing:
        return f"w:{comp}" if comp else "w"
    return "r:*"


def pack_cache(
    root: str | os.PathLike[str],
    out_file: str | os.PathLike[str],
    include_inductor: bool = False,
) -> PackResult:
    """Write the cache (``artifacts/``, ``models/``; ``inductor/`` too with
    ``include_inductor``) into one tar archive, gzip/bz2/xz by suffix
    (``.tar.gz``, ``.tgz``...), led by ``manifest.json`` (format version,
    every file's relative path, size and BLAKE3).

    Paths are relative; symlinks are never followed (they are left out and
    listed in ``skipped``); locks, leases, temp and quarantined files are
    left out. The archive is written atomically (temp file + rename).
    """
    root_p = Path(root)
    out = Path(out_file)
    if not root_p.is_dir():
        raise CacheError(errno.ENOENT, f"no fxpiece cache at {root_p}", str(root_p))
    out_abs = out.resolve()
    root_abs = root_p.resolve()
    if out_abs == root_abs or root_abs in out_abs.parents:
        raise CacheError(
            errno.EINVAL, f"write the archive outside the cache folder {root_p}", str(out)
        )
    skipped: list[str] = []
    tops = (*_PACKED_TOPS, "inductor") if include_inductor else _PACKED_TOPS
    rels = _pack_files(root_p, tops, skipped)
    report = hash_files_report([str(root_p / r) for r in rels]) if rels else None
    by_path = {f.path: f for f in report.files} if report else {}
    files: list[dict[str, Any]] = []
    for rel in rels:
        f = by_path.get(str(root_p / rel))
        if f is None or f.digest is None:
            skipped.append(f"{rel} (unreadable: {f.skipped if f else 'vanished'})")
            continue
        files.append({"path": rel, "size": f.size, "blake3": f.digest})
    manifest = {
        "format": PACK_FORMAT,
        "version": PACK_VERSION,
        "created": time.time(),
        "fxpiece": _version(),
        "include_inductor": include_inductor,
        "files": files,
    }
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(6)}")
    try:
        with open(tmp, "xb") as raw:
            with tarfile.open(
                fileobj=raw, mode=_tar_mode(out, True), format=tarfile.PAX_FORMAT
            ) as tar:  # type: ignore[call-overload]
                tar.addfile(_member(MANIFEST, len(body), time.time()), io.BytesIO(body))
                for entry in files:
                    path = root_p / entry["path"]
                    with open(path, "rb") as src:
                        st = os.fstat(src.fileno())
                        if st.st_size != entry["size"]:
                            raise CacheError(
                                errno.EAGAIN,
                                f"{path} changed while packing; pack again",
                                str(path),
                            )
                        tar.addfile(_member(entry["path"], entry["size"], st.st_mtime), src)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return PackResult(
        archive=out,
        files=len(files),
        bytes=sum(int(e["size"]) for e in files),
        archive_bytes=out.stat().st_size,
        skipped=tuple(skipped),
    )


def _member(name: str, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = int(mtime)
    info.mode = 0o600
    info.type = tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("fxpiece")
    except Exception:
        return "unknown"


def _refuse(archive: Path, why: str) -> ArchiveError:
    return ArchiveError(
        errno.EINVAL, f"refusing {archive}: {why}; nothing was written", str(archive)
    )


def _read_manifest(tar: tarfile.TarFile, archive: Path) -> dict[str, dict[str, Any]]:
    try:
        member = tar.getmember(MANIFEST)
    except KeyError:
        raise _refuse(archive, f"no {MANIFEST} (not an fxpiece cache archive)") from None
    fobj = tar.extractfile(member) if member.isreg() else None
    if fobj is None or member.size > 256 * 1024 * 1024:
        raise _refuse(archive, f"{MANIFEST} is not a regular file of sane size")
    try:
        manifest = json.loads(fobj.read())
    except ValueError as e:
        raise _refuse(archive, f"{MANIFEST} is not JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != PACK_FORMAT:
        raise _refuse(archive, f"{MANIFEST} is not an {PACK_FORMAT} manifest")
    if manifest.get("version") != PACK_VERSION:
        raise _refuse(
            archive,
            f"archive format version {manifest.get('version')!r}; this fxpiece reads "
            f"version {PACK_VERSION}",
        )
    files: dict[str, dict[str, Any]] = {}
    entries = manifest.get("files")
    if not isinstance(entries, list):
        raise _refuse(archive, f"{MANIFEST} has no file list")
    for item in entries:
        p = item.get("path") if isinstance(item, dict) else None
        if not isinstance(p, str) or not _unpack_path_ok(p):
            raise _refuse(archive, f"unsafe or unexpected path {p!r} in {MANIFEST}")
        size, b3 = item.get("size"), item.get("blake3")
        if not isinstance(size, int) or size < 0 or not isinstance(b3, str) or p in files:
            raise _refuse(archive, f"bad manifest entry for {p!r}")
        files[p] = item
    return files


def _unpack_path_ok(name: str) -> bool:
    return _safe_relpath(name) and name.split("/", 1)[0] in _UNPACK_TOPS and "/" in name


def _mkdirs_private(root: Path, rel_dir: str) -> Path:
    """Create ``root/rel_dir`` one part at a time (0700), refusing to go
    through a symlink or a non-folder."""
    cur = root
    for part in [p for p in rel_dir.split("/") if p]:
        cur = cur / part
        try:
            os.mkdir(cur, 0o700)
        except FileExistsError:
            st = os.lstat(cur)
            if not stat.S_ISDIR(st.st_mode):
                raise CacheError(
                    errno.ENOTDIR,
                    f"{cur} is a symlink or a file, not a folder; refusing to write through it",
                    str(cur),
                ) from None
    return cur


def unpack_cache(archive: str | os.PathLike[str], root: str | os.PathLike[str]) -> UnpackResult:
    """Unpack an archive made by :func:`pack_cache` into the cache ``root``.

    Every member is checked before anything is written: it must be a regular
    file (no links or devices) with a safe relative path under
    ``artifacts/``, ``models/`` or ``inductor/`` (no absolute paths, no
    ``..``), listed in the manifest with its size; a refused archive raises
    :class:`ArchiveError`. The files are then extracted into a private
    staging folder inside ``root`` and their BLAKE3 checked against the
    manifest; only if all match are they renamed into place one by one (no
    half-written file is ever visible). Folders are created 0700, files 0600.
    """
    arc = Path(archive)
    if not arc.is_file():
        raise CacheError(errno.ENOENT, f"no archive at {arc}", str(arc))
    try:
        with tarfile.open(arc, mode="r:*") as tar:
            return _unpack(tar, arc, Path(root))
    except (tarfile.TarError, EOFError, zlib.error) as e:
        why = str(e).splitlines()[0].rstrip(":") if str(e) else type(e).__name__
        raise _refuse(arc, f"not a readable tar archive ({why})") from None


def _unpack(tar: tarfile.TarFile, arc: Path, root_p: Path) -> UnpackResult:
    files = _read_manifest(tar, arc)
    members = [m for m in tar.getmembers() if m.name != MANIFEST]
    seen: set[str] = set()
    for m in members:
        if m.isdir():
            if not (_safe_relpath(m.name) and m.name.split("/", 1)[0] in _UNPACK_TOPS):
                raise _refuse(arc, f"unsafe member path {m.name!r}")
            continue
        if not _unpack_path_ok(m.name):
            raise _refuse(arc, f"unsafe member path {m.name!r}")
        if not m.isreg():
            raise _refuse(arc, f"{m.name!r} is a link or special file")
        if m.name in seen:
            raise _refuse(arc, f"{m.name!r} appears twice")
        seen.add(m.name)
        want = files.get(m.name)
        if want is None:
            raise _refuse(arc, f"{m.name!r} is not in the manifest")
        if want["size"] != m.size:
            raise _refuse(arc, f"{m.name!r} is {m.size} bytes, the manifest says {want['size']}")
    missing = sorted(set(files) - seen)
    if missing:
        raise _refuse(arc, f"{len(missing)} manifest files are missing, e.g. {missing[0]!r}")

    root_p.mkdir(mode=0o700, parents=True, exist_ok=True)
    if root_p.is_symlink():
        root_p = root_p.resolve()
    staging = root_p / f".unpack-{os.getpid()}-{secrets.token_hex(6)}"
    os.mkdir(staging, 0o700)
    try:
        staged: list[tuple[str, Path]] = []
        for i, m in enumerate(members):
            if m.isdir():
                continue
            src = tar.extractfile(m)
            if src is None:
                raise _refuse(arc, f"cannot read {m.name!r}")
            tmp = staging / f"{i:08d}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
                dst.flush()
                os.fsync(dst.fileno())
            staged.append((m.name, tmp))
        got = {f.path: f for f in hash_files_report([str(t) for _, t in staged]).files}
        for name, tmp in staged:
            f = got.get(str(tmp))
            if f is None or f.digest != files[name]["blake3"] or f.size != files[name]["size"]:
                raise _refuse(arc, f"{name!r} does not match its checksum in the manifest")
        written = unchanged = 0
        current = _current_digests(root_p, [n for n, _ in staged])
        for name, tmp in staged:
            if current.get(name) == files[name]["blake3"]:
                unchanged += 1
                continue
            parent = _mkdirs_private(root_p, posixpath.dirname(name))
            dest = parent / posixpath.basename(name)
            st = _lstat(dest)
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise CacheError(
                    errno.EEXIST, f"{dest} exists and is not a regular file", str(dest)
                )
            os.replace(tmp, dest)
            written += 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return UnpackResult(
        root=root_p,
        written=written,
        unchanged=unchanged,
        bytes=sum(int(files[n]["size"]) for n in seen),
    )


def _current_digests(root: Path, names: Sequence[str]) -> dict[str, str | None]:
    present = []
    for n in names:
        st = _lstat(root / n)
        if st is not None and stat.S_ISREG(st.st_mode):
            present.append(n)
    if not present:
        return {}
    by_path = {f.path: f.digest for f in hash_files_report([str(root / n) for n in present]).files}
    return {n: by_path.get(str(root / n)) for n in present}
