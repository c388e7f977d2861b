"""Every path and file-name pattern under a cache root; nothing else builds them.

::

    <root>/                               created 0700
      artifacts/<2 hex>/<digest>          compiled pieces, content-addressed, write-once
      models/<key[:32]>/<model_tag>/
        index/                            CacheIndex: typed keys -> {digest, handle} (entries.py)
        cache_key_factors.json            the factors behind <key>
        computation_graph.py              the split graph, readable
      locks/<digest>.lease                single-flight compile leases

Inductor never works under the root: it gets a private temporary folder per
backend, and its kernels are stored as a verified artifact (the kernel bundle).

Index values and handles hold paths relative to ``<root>`` (``artifacts/..``),
so a cache folder can be moved or copied.

>>> from fxpiece.cache.layout import CacheLayout
>>> lay = CacheLayout("/c")
>>> lay.artifact_rel("ab" * 32)
'artifacts/ab/abababababababababababababababababababababababababababababababab'
>>> str(lay.model_dir("0123" * 16, "backbone"))
'/c/models/01230123012301230123012301230123/backbone'
>>> CacheLayout.is_quarantined("x.corrupt-1700000000"), CacheLayout.is_temp(".tmp-h-1-a")
(True, True)
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FACTORS_FILE", "GRAPH_FILE", "KEY_DIR_LEN", "CacheLayout", "safe_relpath"]

FACTORS_FILE = "cache_key_factors.json"
"""The factors behind a model folder's key, next to its ``index/``."""
GRAPH_FILE = "computation_graph.py"
"""The split graph of a model folder, readable."""
KEY_DIR_LEN = 32
"""Model folders are named by the first 32 hex digits of their key."""
_QUARANTINE = ".corrupt-"
_STALE = ".stale-"
_LEASE = ".lease"


def safe_relpath(name: str) -> bool:
    """A normalized relative POSIX path inside its root: no ``..``, not
    absolute, no empty, ``.`` or hidden parts, no backslashes or NULs.

    >>> safe_relpath("artifacts/ab/cd"), safe_relpath("../x"), safe_relpath("a/.b")
    (True, False, False)
    """
    if not name or "\\" in name or "\x00" in name or name.startswith("/"):
        return False
    if posixpath.normpath(name) != name:
        return False
    return all(part and part != ".." and not part.startswith(".") for part in name.split("/"))


@dataclass(frozen=True)
class CacheLayout:
    """The folders and file names of one cache root."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    # -- top-level folders -------------------------------------------------
    @property
    def artifacts_dir(self) -> Path:
        return self.root / "artifacts"

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    # -- artifacts ---------------------------------------------------------
    @staticmethod
    def artifact_rel(digest: str) -> str:
        """The artifact's path relative to the root (what handles store)."""
        return f"artifacts/{digest[:2]}/{digest}"

    def artifact_path(self, digest: str) -> Path:
        return self.root / self.artifact_rel(digest)

    @staticmethod
    def is_artifact_rel(rel: object) -> bool:
        """Whether a handle's relative path is a safe path under ``artifacts/``."""
        return isinstance(rel, str) and safe_relpath(rel) and rel.startswith("artifacts/")

    @staticmethod
    def digest_of_artifact(rel: str) -> str:
        return posixpath.basename(rel)

    def inside(self, rel: str) -> Path | None:
        """``root / rel`` resolved, or ``None`` if it (or a symlink on the
        way) leads out of the root: handles are never followed out of it."""
        path = (self.root / rel).resolve()
        return path if self.root.resolve() in path.parents else None

    # -- models ------------------------------------------------------------
    @staticmethod
    def key_dir_name(key: str) -> str:
        return key[:KEY_DIR_LEN]

    def model_dir(self, key: str, model_tag: str) -> Path:
        return self.models_dir / self.key_dir_name(key) / model_tag

    @staticmethod
    def model_rel(key_dir: str, model_tag: str) -> str:
        return f"models/{key_dir}/{model_tag}"

    @staticmethod
    def index_dir(model_dir: Path) -> Path:
        return model_dir / "index"

    @staticmethod
    def is_index_file(name: str) -> bool:
        """A data file of an index folder (``log-*.json``, ``snap-*.json``)."""
        return name.startswith(("log-", "snap-")) and name.endswith(".json")

    @staticmethod
    def factors_file(model_dir: Path) -> Path:
        return model_dir / FACTORS_FILE

    @staticmethod
    def graph_file(model_dir: Path) -> Path:
        return model_dir / GRAPH_FILE

    def model_dirs(self, model_tag: str | None = None) -> Iterator[Path]:
        """Every ``models/<key>/<tag>`` folder (symlinks are not followed)."""
        try:
            keys = sorted(os.scandir(self.models_dir), key=lambda e: e.name)
        except OSError:
            return
        for k in keys:
            if not k.is_dir(follow_symlinks=False):
                continue
            try:
                tags = sorted(os.scandir(k.path), key=lambda e: e.name)
            except OSError:
                continue
            for t in tags:
                if t.is_dir(follow_symlinks=False) and model_tag in (None, t.name):
                    yield Path(t.path)

    # -- leases ------------------------------------------------------------
    def lease_path(self, digest: str) -> Path:
        return self.locks_dir / f"{digest}{_LEASE}"

    @staticmethod
    def is_lease(name: str) -> bool:
        return name.endswith(_LEASE)

    @staticmethod
    def stale_lease_name(path: str, token: str) -> str:
        """Where a stale lease is renamed before it is taken over."""
        return f"{path}{_STALE}{token}"

    # -- names of files that are not live cache content -------------------
    @staticmethod
    def is_temp(name: str) -> bool:
        """A file being written (temp + rename)."""
        return name.startswith(".tmp")

    @staticmethod
    def is_quarantined(name: str) -> bool:
        """A bad file moved aside (``<name>.corrupt-<time>[.<n>]``)."""
        return _QUARANTINE in name

    @staticmethod
    def is_bookkeeping(name: str) -> bool:
        """Temps, locks, leases, quarantined and stale files: never packed,
        never live content."""
        return (
            name.startswith(".")
            or name == "LOCK"
            or name.endswith((".lock", _LEASE))
            or _QUARANTINE in name
            or _STALE in name
        )
