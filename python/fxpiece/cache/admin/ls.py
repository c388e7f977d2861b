"""``fxpiece cache ls``: what a cache holds, per model folder.

>>> import tempfile, pathlib
>>> from fxpiece.cache.admin import list_cache
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> listing = list_cache(root)
>>> len(listing.models), listing.total_artifact_bytes
(0, 0)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxpiece.cache.admin.scan import (
    ArtifactFile,
    ModelScan,
    Scan,
    artifact_rel,
    list_dir,
    lstat,
    model_key,
    scan_cache,
)
from fxpiece.cache.entries import AotKey, Entry, KernelsKey, RawKey, UnknownKey, decode_key
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.store import read_header

__all__ = ["CacheListing", "EntryInfo", "ModelInfo", "list_cache"]


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
    signer: str | None = None
    """Who the artifact's header says signed it (``ed25519:...``); ``None``:
    unsigned (before ``v3``), no artifact, or unreadable. Read from the
    header only, not verified: ``fxpiece cache verify`` checks signatures."""
    kind: str = "piece"
    """``piece``, ``kernels``, ``aot`` or ``unknown``
    (:mod:`fxpiece.cache.entries`); start, end, piece and compiler are
    shown in the schema-1 form."""

    @property
    def signer_short(self) -> str:
        return "unsigned" if self.signer is None else self.signer[:20] + ".."

    @property
    def range(self) -> str:
        """``[start,end]``; for an ahead-of-time entry, which captured graph
        it is (``#0``, ``#1``...)."""
        if self.kind == AotKey.kind:
            return f"#{self.start}"
        return f"[{self.start},{self.end}]"

    def as_dict(self) -> dict[str, Any]:
        return {
            "range": [self.start, self.end],
            "piece": self.piece,
            "compiler": self.compiler,
            "digest": self.digest,
            "artifact": self.artifact,
            "size": self.size,
            "signer": self.signer,
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
    kernels: tuple[EntryInfo, ...] = ()
    """The entries of its kernel bundles (Inductor's compiled kernels: one
    per compiled piece entry and one for the model; not pieces, so not in
    ``entries``)."""

    @property
    def pieces(self) -> tuple[int, ...]:
        return tuple(sorted({e.piece for e in self.entries}))

    @property
    def ranges(self) -> tuple[str, ...]:
        ordered = sorted(self.entries, key=lambda e: (e.start, e.end))
        return tuple(dict.fromkeys(e.range for e in ordered))

    @property
    def compilers(self) -> tuple[str, ...]:
        return tuple(sorted({e.compiler for e in self.entries}))

    @property
    def signers(self) -> tuple[str, ...]:
        """The short signers of its artifacts (``unsigned`` for pre-``v3`` ones)."""
        found = (e for e in (*self.entries, *self.kernels) if e.size is not None)
        return tuple(sorted({e.signer_short for e in found}))

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
            "signers": list(self.signers),
            "artifact_bytes": self.artifact_bytes,
            "missing_artifacts": self.missing_artifacts,
            "last_use": self.last_use,
            "problems": list(self.problems),
            "kernels": [k.as_dict() for k in self.kernels],
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
            "problems": list(self.problems),
        }


def _signer(root: Path, rel: str, seen: dict[str, str | None]) -> str | None:
    """The signer an artifact's header names (read once per listing)."""
    if rel not in seen:
        try:
            seen[rel] = str(read_header(root / rel).signer or "") or None
        except OSError:
            seen[rel] = None
    return seen[rel]


def _entry(key: RawKey, value: Any, on_disk: ArtifactFile | None, signer: str | None) -> EntryInfo:
    entry = Entry.from_raw(value)
    start, end, piece, compiler = _shown(key)
    return EntryInfo(
        start,
        end,
        piece,
        compiler,
        digest=entry.digest if entry is not None else None,
        artifact=artifact_rel(value),
        size=on_disk.size if on_disk else None,
        signer=signer,
        kind=decode_key(key).kind,
    )


def _mtime(path: Path) -> float | None:
    st = lstat(path)
    return st.st_mtime if st is not None else None


def _last_use(scan: Scan, m: ModelScan, used: Mapping[str, ArtifactFile]) -> float | None:
    """Loading touches an artifact; index files change on compiles (and
    removals), so they only date models without artifacts."""
    times = [a.mtime for a in used.values()]
    if not times:
        for ent in list_dir(scan.layout.index_dir(m.folder)):
            if CacheLayout.is_index_file(ent.name):
                with contextlib.suppress(OSError):
                    times.append(ent.stat(follow_symlinks=False).st_mtime)
    return max(times) if times else _mtime(scan.layout.factors_file(m.folder))


def _shown(key: RawKey) -> RawKey:
    """How an entry's key is shown: in the schema-1 form (a key no schema
    names: as stored)."""
    typed = decode_key(key)
    return key if isinstance(typed, UnknownKey) else typed.legacy_raw()


def _shown_order(kv: tuple[RawKey, Any]) -> tuple[Any, ...]:
    """Entries by piece, then range (as shown)."""
    s, e, piece, compiler = _shown(kv[0])
    return (piece, s, e, compiler, kv[0][3])


def _model_info(scan: Scan, m: ModelScan, seen: dict[str, str | None]) -> ModelInfo:
    entries: list[EntryInfo] = []
    kernels: list[EntryInfo] = []
    used: dict[str, ArtifactFile] = {}
    missing: set[str] = set()
    for key, value in sorted(m.entries, key=_shown_order):
        rel = artifact_rel(value)
        on_disk = scan.artifacts.get(rel) if rel else None
        if rel and on_disk is None:
            missing.add(rel)
        elif rel and on_disk is not None:
            used[rel] = on_disk
        signer = _signer(scan.layout.root, rel, seen) if rel and on_disk else None
        if isinstance(decode_key(key), KernelsKey):
            kernels.append(_entry(key, value, on_disk, signer))
        else:
            entries.append(_entry(key, value, on_disk, signer))
    return ModelInfo(
        key=model_key(m),
        tag=m.tag,
        folder=m.folder,
        entries=tuple(entries),
        artifact_bytes=sum(a.size for a in used.values()),
        missing_artifacts=len(missing),
        last_use=_last_use(scan, m, used),
        problems=(*(f"{p.file}: {p.reason}" for p in m.index_problems), *m.problems),
        kernels=tuple(kernels),
    )


def list_cache(root: str | os.PathLike[str]) -> CacheListing:
    """Every model folder (key, tag, entries, pieces, ranges, compilers,
    bytes of the artifacts it references, last use), the artifacts, the
    orphans (artifacts no entry references) and quarantined files.

    Listing changes nothing on disk: indexes are opened read-only (an index
    with corrupt files lists its good entries; ``verify --repair`` moves the
    bad ones aside), and hostile files are reported, never opened."""
    scan = scan_cache(root)
    seen: dict[str, str | None] = {}
    models = sorted(
        (_model_info(scan, m, seen) for m in scan.models), key=lambda mi: -(mi.last_use or 0)
    )
    live = sorted(scan.artifacts.items())
    hostile = [f"{rel} {why}" for rel, why in sorted(scan.hostile.items())]
    return CacheListing(
        root=scan.root,
        models=tuple(models),
        artifacts=tuple(a for _, a in live),
        orphans=tuple(a for rel, a in live if rel not in scan.refs),
        quarantined=tuple(scan.quarantined),
        temps=tuple(scan.temps),
        problems=(*scan.problems, *hostile),
    )
