"""``fxpiece cache verify [--repair]``: check every index and artifact.

An artifact is checked the way the backend loads it
(:meth:`~fxpiece.cache.store.ArtifactStore.load`): read once with
:func:`~fxpiece.cache.safeio.read_regular` (never a FIFO, symlink, device or
oversized file), its header, length and checksum verified by
:func:`~fxpiece.cache.store.parse_artifact` (with the digest its header
records, ``v2``/``v3``, equal to the digest of the path it is stored
under), the signature of a ``v3`` file verified and its signer looked up in
the trusted keys (:func:`~fxpiece.signing.trusted_keys`: a signer that is
not trusted, or revoked, is a problem, moved aside by ``--repair`` as the
backend would), and its checksum compared with the ``blake3`` of every
index entry that references it (what binds a ``v1`` file, which records no
digest). Unsigned ``v1``/``v2`` files (written before ``v3``) load from a
root of your own, so they are counted (``unsigned``), not problems.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxpiece.cache.admin.scan import (
    ARTIFACT_FILE_LIMIT,
    IndexCheck,
    Ref,
    Scan,
    hostile_reason,
    lstat,
    model_key,
    remove_entries,
    scan_cache,
)
from fxpiece.cache.entries import KernelsKey, decode_key
from fxpiece.cache.index import CacheIndex
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.safeio import read_regular
from fxpiece.cache.store import check_artifact_signer, decode_artifact, quarantine
from fxpiece.cache.trust import find_untrusted
from fxpiece.errors import CacheError, HostileFileError
from fxpiece.signing import PublicKey, TrustedKeys, trusted_keys

__all__ = ["ArtifactProblem", "CacheVerifyReport", "IndexCheck", "verify_cache"]


@dataclass(frozen=True, slots=True)
class ArtifactProblem:
    """An artifact that is missing or bad, or a file under ``artifacts/``
    that is no artifact at all (then ``referenced_by`` may be empty)."""

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
    kernel_bundles_checked: int = 0
    """Kernel bundles checked (artifacts too, not counted in ``artifacts_checked``)."""
    untrusted: tuple[str, ...] = ()
    """Paths the backend would refuse (trust boundary), with why and the fix."""
    signers: tuple[tuple[PublicKey, int], ...] = ()
    """Who signed the good artifacts (and kernel bundles), how many each."""
    unsigned: int = 0
    """Good artifacts without a signature (written before ``v3``: they load
    from this root only while it is your own; push signs them on the way
    out, ``unpack`` and ``pull`` refuse them)."""

    @property
    def index_problems(self) -> int:
        return sum(len(i.problems) for i in self.indexes)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.index_problems and not self.untrusted

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "ok": self.ok,
            "repaired": self.repaired,
            "indexes": [i.as_dict() for i in self.indexes],
            "artifacts_checked": self.artifacts_checked,
            "kernel_bundles_checked": self.kernel_bundles_checked,
            "untrusted": list(self.untrusted),
            "signers": {str(k): n for k, n in self.signers},
            "unsigned": self.unsigned,
            "artifact_bytes": self.artifact_bytes,
            "problems": [p.as_dict() for p in self.problems],
            "unreferenced": list(self.unreferenced),
            "warnings": list(self.warnings),
        }


def _reason(e: OSError, path: Path) -> str:
    """An error's message without the path it starts with."""
    msg = e.strerror or str(e)
    for prefix in (f"{path}: ", f"{path} "):
        msg = msg.removeprefix(prefix)
    return msg


def _read(layout: CacheLayout, rel: str) -> tuple[bytes | None, str | None]:
    """The bytes of the artifact file at ``rel``, or why it cannot be read."""
    if layout.inside(posixpath.dirname(rel)) is None:
        return None, "reached through a symlink out of the cache root (not followed)"
    path = layout.root / rel
    try:
        return read_regular(path, ARTIFACT_FILE_LIMIT), None
    except (FileNotFoundError, NotADirectoryError):
        return None, "missing"
    except HostileFileError as e:
        st = lstat(path)
        why = hostile_reason(st, ARTIFACT_FILE_LIMIT) if st is not None else None
        return None, why or f"{_reason(e, path)} (never read)"
    except OSError as e:
        return None, f"unreadable ({e.strerror or e})"


@dataclass(frozen=True, slots=True)
class _Fault:
    reason: str | None
    """Why the artifact is bad; ``None``: it is good."""
    size: int
    signer: PublicKey | None = None


def artifact_fault(
    layout: CacheLayout, rel: str, refs: Sequence[Ref], trusted: TrustedKeys | None = None
) -> tuple[str | None, int]:
    """Why the artifact at ``rel`` is bad (``None``: it is good), and its
    size in bytes if it could be read (``trusted``: default
    :func:`~fxpiece.signing.trusted_keys`)."""
    f = _fault(layout, rel, refs, trusted_keys() if trusted is None else trusted)
    return f.reason, f.size


def _fault(layout: CacheLayout, rel: str, refs: Sequence[Ref], trusted: TrustedKeys) -> _Fault:
    data, why = _read(layout, rel)
    if data is None:
        return _Fault(why, 0)
    if not data:
        return _Fault("empty (0 bytes)", 0)
    try:
        art = decode_artifact(data, rel, CacheLayout.digest_of_artifact(rel))
        check_artifact_signer(art, trusted, rel, unsigned_ok=True)
    except CacheError as e:
        return _Fault(_reason(e, Path(rel)), len(data))
    got = art.checksum
    for r in refs:
        if r.blake3 is None:
            return _Fault(f"{r.label()}: its index entry has no checksum", len(data))
        if got != r.blake3:
            return _Fault(
                f"checksum mismatch with the index (BLAKE3 {got[:12]}.., "
                f"{r.label()} expects {r.blake3[:12]}..)",
                len(data),
            )
    return _Fault(None, len(data), art.signer)


class _Verifier:
    """One verify run: the problems found, the indexes opened to repair."""

    def __init__(self, scan: Scan, repair: bool, trusted: TrustedKeys) -> None:
        self.scan = scan
        self.repair = repair
        self.trusted = trusted
        self.indexes: dict[Path, CacheIndex] = {}
        self.problems: list[ArtifactProblem] = []
        self.checked_bytes = 0
        self.signers: dict[PublicKey, int] = {}
        self.unsigned = 0

    def artifact(self, rel: str, refs: Sequence[Ref], reason: str | None = None) -> None:
        """Check (unless ``reason`` is known) and, with repair, move aside."""
        if reason is None:
            f = _fault(self.scan.layout, rel, refs, self.trusted)
            reason = f.reason
            self.checked_bytes += f.size
            if reason is None and f.signer is None:
                self.unsigned += 1
            elif reason is None and f.signer is not None:
                self.signers[f.signer] = self.signers.get(f.signer, 0) + 1
        if reason is None:
            return
        moved, removed = None, 0
        if self.repair:
            # Re-check first: another process may have rewritten it meanwhile.
            if _fault(self.scan.layout, rel, refs, self.trusted).reason is None:
                return
            moved = self._move_aside(rel)
            removed = remove_entries(refs, self.indexes)
        labels = tuple(r.label() for r in refs)
        self.problems.append(ArtifactProblem(rel, reason, labels, moved, removed))

    def _move_aside(self, rel: str) -> str | None:
        layout = self.scan.layout
        path = layout.root / rel
        if layout.inside(posixpath.dirname(rel)) is None or lstat(path) is None:
            return None
        aside = quarantine(path)
        return self.scan.rel(aside) if aside else None

    def bad_handle(self, r: Ref) -> None:
        removed = remove_entries([r], self.indexes) if self.repair else 0
        where = str(r.value.get("handle", {}).get("artifact"))
        why = "the handle points outside <root>/artifacts (refused)"
        self.problems.append(ArtifactProblem(where, why, (r.label(),), None, removed))


def _notes(scan: Scan) -> list[str]:
    notes = list(scan.problems)
    for m in scan.models:
        notes.extend(f"{m.rel}: {p}" for p in m.problems)
        factors = scan.layout.factors_file(m.folder)
        if lstat(factors) and model_key(m) == m.key_dir:
            notes.append(
                f"{scan.rel(factors)} is unreadable or does not match its key folder (the "
                "next run rewrites it; `fxpiece cache explain` may mislead until then)"
            )
    return notes


def verify_cache(
    root: str | os.PathLike[str], repair: bool = False, *, trusted: TrustedKeys | None = None
) -> CacheVerifyReport:
    """Check every index (``verify_index``) and every artifact an index
    references (readable, header, length, checksum, signature and signer
    against ``trusted``, default :func:`~fxpiece.signing.trusted_keys`, and
    the checksum each entry recorded); report every file under ``artifacts/`` that is no
    artifact (FIFO, symlink, folder, device, oversized: never read); list
    unreferenced artifacts. Each bad artifact is one problem.

    With ``repair=True``: corrupt index files and bad artifacts are moved
    aside (``*.corrupt-<unix time>``, never deleted) and the index entries
    pointing to bad or missing artifacts are removed, so the next run
    recompiles exactly those. Without it nothing on disk changes.
    """
    keys = trusted_keys() if trusted is None else trusted
    scan = scan_cache(root, repair_indexes=repair)
    v = _Verifier(scan, repair, keys)
    for rel in sorted(scan.refs):
        v.artifact(rel, scan.refs[rel])
    for rel, why in sorted(scan.hostile.items()):
        if rel not in scan.refs:
            v.artifact(rel, (), why)
    for r in scan.bad_handles:
        v.bad_handle(r)
    bundles = sum(
        all(isinstance(decode_key(r.key), KernelsKey) for r in refs) for refs in scan.refs.values()
    )
    return CacheVerifyReport(
        root=scan.root,
        repaired=repair,
        indexes=tuple(scan.checks),
        artifacts_checked=len(scan.refs) - bundles,
        kernel_bundles_checked=bundles,
        artifact_bytes=v.checked_bytes,
        problems=tuple(v.problems),
        unreferenced=tuple(rel for rel in sorted(scan.artifacts) if rel not in scan.refs),
        warnings=tuple(_notes(scan)),
        untrusted=tuple(str(e) for e in find_untrusted(scan.root)),
        signers=tuple(sorted(v.signers.items())),
        unsigned=v.unsigned,
    )
