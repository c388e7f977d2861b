"""``fxpiece cache prune``: remove least recently used artifacts and the
index entries pointing to them, never one a compile is using."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxpiece.cache.admin.scan import ArtifactFile, Scan, lstat, remove_entries, scan_cache
from fxpiece.cache.index import CacheIndex
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.lease import DEFAULT_LEASE_TTL, Lease, read_lease

__all__ = ["PruneItem", "PruneResult", "prune_cache"]


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


def live_lease(layout: CacheLayout, rel: str) -> str | None:
    """Who holds a live compile lease on the artifact's digest, if anyone."""
    info = read_lease(str(layout.lease_path(layout.digest_of_artifact(rel))))
    if info is None or Lease.is_stale(info, ttl=DEFAULT_LEASE_TTL):
        return None
    who = f"{info.host} pid {info.pid}" if info.token else "a lease being written"
    return f"in use: compile lease held by {who}"


class _Pruner:
    def __init__(self, scan: Scan, max_size: int | None, older_than: float | None) -> None:
        self.scan = scan
        self.max_size = max_size
        self.older_than = older_than
        self.total = sum(a.size for a in scan.artifacts.values())
        self.removed: list[PruneItem] = []
        self.kept = [
            PruneItem(t.path, t.size, t.mtime, "being written (.tmp file)") for t in scan.temps
        ]
        self.indexes: dict[Path, CacheIndex] = {}

    def why(self, a: ArtifactFile, now: float) -> str | None:
        """Why ``a`` should go, or ``None``."""
        old = self.older_than is not None and now - a.mtime > self.older_than
        big = self.max_size is not None and self.total > self.max_size
        if not (old or big):
            return None
        why = "older than the limit" if old else "least recently used, over the size limit"
        return why if a.path in self.scan.refs else f"unreferenced; {why}"

    def prune(self, a: ArtifactFile, why: str, dry_run: bool) -> None:
        layout = self.scan.layout
        held = live_lease(layout, a.path)
        if held is not None:
            self.kept.append(PruneItem(a.path, a.size, a.mtime, held))
            return
        path = layout.root / a.path
        st = lstat(path)
        if st is None:
            self.total -= a.size  # already gone
            return
        if st.st_mtime > a.mtime:
            self.kept.append(PruneItem(a.path, a.size, st.st_mtime, "used while pruning"))
            return
        refs = self.scan.refs.get(a.path, [])
        n = len(refs) if dry_run else remove_entries(refs, self.indexes)
        if not dry_run:
            held = live_lease(layout, a.path)  # a compile may have started meanwhile
            if held is not None:
                self.kept.append(PruneItem(a.path, a.size, a.mtime, held, n))
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.total -= a.size
        self.removed.append(PruneItem(a.path, a.size, a.mtime, why, n))


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
    ``.tmp-*`` file being written; quarantined and hostile files are left
    for ``verify --repair`` and the user.
    """
    if max_size is None and older_than is None:
        raise ValueError("prune_cache needs max_size or older_than")
    if max_size is not None and max_size < 0:
        raise ValueError(f"max_size must be >= 0, got {max_size}")
    if older_than is not None and not 0 <= older_than < float("inf"):
        raise ValueError(f"older_than must be a finite number >= 0, got {older_than}")
    scan = scan_cache(root)
    now = time.time() if now is None else now
    p = _Pruner(scan, max_size, older_than)
    before = p.total
    order = sorted(scan.artifacts.values(), key=lambda a: (a.path in scan.refs, a.mtime, a.path))
    for a in order:
        why = p.why(a, now)
        if why is not None:
            p.prune(a, why, dry_run)
    return PruneResult(
        root=scan.root,
        dry_run=dry_run,
        max_size=max_size,
        older_than=older_than,
        bytes_before=before,
        bytes_after=p.total,
        removed=tuple(p.removed),
        kept=tuple(p.kept),
    )
