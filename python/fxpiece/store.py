"""On-disk layout of the cache and the atomic, verified artifact store.

::

    <cache_root>/                     created 0700
      artifacts/<2 hex>/<digest>      compiled pieces, content-addressed, write-once
      models/<key>/<model_tag>/
        index/                        CacheIndex: (start, end, piece, compiler) -> handle
        cache_key_factors.json        the factors behind <key>
        computation_graph.py          the split graph, readable
      inductor/                       Inductor's own cache (kernels, ISA checks)

Every path stored in an index is relative to ``<cache_root>``, so a cache
folder can be moved or copied.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxpiece.context import validate_path_part
from fxpiece.errors import CacheError, UntrustedCacheError
from fxpiece.hashing import hash_files_report
from fxpiece.index import CacheIndex, write_atomic

__all__ = ["ArtifactStore", "ModelCache", "check_trusted", "ensure_private_dir", "quarantine"]


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) private to the user (0700)."""
    try:
        missing = []
        p = path
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        for d in reversed(missing):  # every created level is 0700, not only the last
            d.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise CacheError(
            e.errno or 0,
            f"cannot create cache folder {path}: {e.strerror}; set cache_dir "
            "(FXPIECE_CACHE_ROOT) to a writable folder or disable the cache",
            str(path),
        ) from e
    return path


def check_trusted(folder: Path) -> None:
    """Refuse a folder that another user owns or can write: fxpiece loads
    compiled code from the cache (Inductor imports generated Python and
    unpickles), so whoever can write there could run code as us."""
    try:
        st = folder.stat()
    except FileNotFoundError:
        return
    uid = os.getuid()
    if st.st_uid not in (uid, 0):
        raise UntrustedCacheError(
            errno.EPERM,
            f"cache folder {folder} belongs to uid {st.st_uid}, not to you (uid {uid}); "
            "fxpiece would load code from it. Use a folder of your own, or set "
            "allow_untrusted_cache=True (FXPIECE_ALLOW_UNTRUSTED_CACHE=1) if you trust its owner",
            str(folder),
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedCacheError(
            errno.EPERM,
            f"cache folder {folder} is writable by other users (mode "
            f"{stat.S_IMODE(st.st_mode):o}); fxpiece would load code from it. "
            f"Fix: chmod go-w {folder} (fxpiece creates its folders 0700), or set "
            "allow_untrusted_cache=True (FXPIECE_ALLOW_UNTRUSTED_CACHE=1) if you trust "
            "everyone who can write there",
            str(folder),
        )


def _digest_of(path: Path) -> str | None:
    report = hash_files_report([str(path)])
    return report.files[0].digest if report.files else None


@dataclass(frozen=True)
class ArtifactStore:
    """Content-addressed artifacts under ``<root>/artifacts``."""

    root: Path

    def relpath(self, digest: str) -> str:
        return f"artifacts/{digest[:2]}/{digest}"

    def put(self, digest: str, data: bytes) -> dict[str, Any]:
        """Write ``data`` atomically (temp + fsync + rename) and return the
        handle to keep in an index."""
        rel = self.relpath(digest)
        path = self.root / rel
        ensure_private_dir(path.parent)
        write_atomic(str(path), data)
        return {"artifact": rel, "blake3": _digest_of(path), "size": len(data)}

    def verified_path(self, handle: Any) -> Path | None:
        """The artifact's path if it exists and its checksum matches the
        handle; a mismatching file is moved aside (``*.corrupt-<time>``) and
        ``None`` is returned so the piece is compiled again."""
        if not isinstance(handle, dict) or not isinstance(handle.get("artifact"), str):
            return None
        rel = handle["artifact"]
        path = (self.root / rel).resolve()
        root = self.root.resolve()
        if root not in path.parents:
            return None  # never follow a handle (or symlink) out of the cache
        if not path.is_file():
            return None
        if _digest_of(path) != handle.get("blake3"):
            quarantine(path)
            return None
        return Path(path)

    def touch(self, path: Path) -> None:
        """Record a use (``fxpiece cache prune`` removes least recently used first)."""
        with contextlib.suppress(OSError):  # a read-only cache: uses are not recorded
            os.utime(path, None)


def quarantine(path: Path) -> Path | None:
    """Move a bad file aside (``<name>.corrupt-<unix time>``), never deleting
    it, not even an earlier quarantined copy; ``None`` if it cannot be moved."""
    stamp = int(time.time())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists() or aside.is_symlink():
        aside = path.with_name(f"{path.name}.corrupt-{stamp}.{n}")
        n += 1
    try:
        os.rename(path, aside)
    except OSError:
        return None
    return aside


class ModelCache:
    """The per-model folder: index, key factors and the readable split graph."""

    def __init__(
        self, root: Path, key: str, model_tag: str, *, trust: bool = False, readonly: bool = False
    ) -> None:
        validate_path_part("model_tag", model_tag)
        self.root = root
        self.key = key
        self.readonly = readonly
        self.folder = root / "models" / key[:32] / model_tag
        if not readonly:
            ensure_private_dir(self.folder)
        if not trust:
            for folder in (
                root,
                root / "artifacts",
                root / "models",
                self.folder.parent,
                self.folder,
            ):
                check_trusted(folder)
        index = self.folder / "index"
        self.index = (
            CacheIndex(str(index), readonly=True)
            if readonly
            else CacheIndex(str(ensure_private_dir(index)))
        )
        self.artifacts = ArtifactStore(root)

    def write_text(self, name: str, text: str) -> None:
        path = self.folder / name
        try:
            if path.read_text() == text:
                return
        except OSError:
            pass
        write_atomic(str(path), text.encode())

    def write_factors(self, factors: dict[str, Any]) -> None:
        self.write_text("cache_key_factors.json", json.dumps(factors, indent=1, sort_keys=True))
