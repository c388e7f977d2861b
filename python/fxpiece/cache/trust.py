"""The trust boundary: cache folders private to the user.

fxpiece loads compiled code from the cache (Inductor imports generated Python
and unpickles), so whoever can write there could run code as us. Folders are
created 0700 at every level, and a folder another user owns or can write is
refused (:class:`~fxpiece.UntrustedCacheError`) unless the caller opts out.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from fxpiece.errors import CacheError, UntrustedCacheError

__all__ = ["check_trusted", "ensure_private_dir"]


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
