"""The trust boundary: cache folders private to the user.

fxpiece loads compiled code from the cache (Inductor imports generated Python
and unpickles), so whoever can write there could run code as us. Folders are
created 0700 at every level, and a folder another user owns or can write is
refused (:class:`~fxpiece.UntrustedCacheError`) unless the caller opts out.
Folders under the root are checked before anything is created in them
(:func:`ensure_private_under`): a symlink in place of one is refused, never
followed, so nothing is created outside the root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from fxpiece.cache.layout import CacheLayout
from fxpiece.errors import CacheError, UntrustedCacheError

__all__ = [
    "check_parents",
    "check_stat",
    "check_tree",
    "check_trusted",
    "ensure_private_dir",
    "ensure_private_under",
    "find_untrusted",
]


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


def ensure_private_under(base: Path, path: Path, *, trust: bool = False) -> Path:
    """Create ``path``, a folder under ``base`` (a cache root, or the host's
    temporary folder), one level at a time, 0700: each level below ``base``
    is looked at with ``lstat`` before anything is created in it, and a
    symlink (which could lead out of ``base``), a file, or a folder another
    user owns or can write is refused (:class:`~fxpiece.UntrustedCacheError`
    naming it and the fix) before anything is created below it. A level that
    appears between our look and our ``mkdir`` is checked the same way.
    ``base`` itself is the caller's to check (:func:`check_tree`); with
    ``trust`` (``allow_untrusted_cache``) this is :func:`ensure_private_dir`."""
    if trust:
        return ensure_private_dir(path)
    rel = path.relative_to(base)  # ValueError: a programming error, not a cache state
    cur = base
    try:
        for part in rel.parts:
            cur = cur / part
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(cur, 0o700)
                st = os.lstat(cur)
            if stat.S_ISLNK(st.st_mode):
                raise _refuse(
                    cur,
                    "is a symlink inside the cache (it could lead out of it; nothing is "
                    "created through it)",
                    f"remove it (rm {cur})",
                )
            if not stat.S_ISDIR(st.st_mode):
                raise CacheError(
                    errno.ENOTDIR,
                    f"cannot create cache folder {path}: {cur} is not a folder; remove it or "
                    "set cache_dir (FXPIECE_CACHE_ROOT) to another folder",
                    str(cur),
                )
            check_stat(cur, st)
    except CacheError:
        raise
    except OSError as e:
        raise CacheError(
            e.errno or 0,
            f"cannot create cache folder {path}: {e.strerror}; set cache_dir "
            "(FXPIECE_CACHE_ROOT) to a writable folder or disable the cache",
            str(cur),
        ) from e
    return path


_ALLOW = (
    "set allow_untrusted_cache=True (FXPIECE_ALLOW_UNTRUSTED_CACHE=1) only if you trust "
    "everyone who can write there"
)


def _refuse(path: Path, why: str, fix: str) -> UntrustedCacheError:
    return UntrustedCacheError(
        errno.EPERM,
        f"{path} {why}; fxpiece loads compiled code from the cache, so whoever can write "
        f"there could run code as you. Fix: {fix}, or {_ALLOW}",
        str(path),
    )


def check_stat(path: Path, st: os.stat_result, what: str = "cache folder") -> None:
    """Refuse what another user owns or can write (a folder, or a file we
    are about to load)."""
    uid = os.getuid()
    if st.st_uid not in (uid, 0):
        raise _refuse(
            path,
            f"({what}) belongs to uid {st.st_uid}, not to you (uid {uid})",
            "use a cache folder of your own",
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _refuse(
            path,
            f"({what}) is writable by other users (mode {stat.S_IMODE(st.st_mode):o})",
            f"chmod go-w {path} (fxpiece creates its folders 0700)",
        )


def check_trusted(folder: Path) -> None:
    """Refuse a folder inside the cache that another user owns or can write,
    or a symlink standing in for one (it could lead anywhere)."""
    try:
        st = os.lstat(folder)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(folder, "is a symlink inside the cache", f"remove it (rm {folder})")
    check_stat(folder, st)


def check_parents(root: Path) -> None:
    """Refuse a cache root that someone else could swap: every folder above
    it must belong to you or root and be writable by nobody else, unless it
    has the sticky bit (like /tmp)."""
    uid = os.getuid()
    for parent in root.resolve().parents:
        try:
            st = os.stat(parent)
        except OSError:
            continue
        sticky = bool(st.st_mode & stat.S_ISVTX)
        if st.st_uid not in (uid, 0) and not sticky:
            raise _refuse(
                parent,
                f"(a parent of the cache root {root}) belongs to uid {st.st_uid}, who could "
                "replace the cache",
                "put the cache under a folder you own",
            )
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky:
            raise _refuse(
                parent,
                f"(a parent of the cache root {root}) is writable by other users "
                f"(mode {stat.S_IMODE(st.st_mode):o}) without the sticky bit, so anyone "
                "could swap the cache root",
                f"chmod go-w {parent} (or chmod +t {parent})",
            )


def check_tree(root: Path, folders: Iterable[Path], files_in: Iterable[Path] = ()) -> None:
    """The trust checks the backend runs before loading: every folder above
    ``root`` (:func:`check_parents`), ``root`` itself (it may be a symlink you
    made), each of ``folders`` (:func:`check_trusted`) and every entry of each
    of ``files_in``. Raises the first :class:`UntrustedCacheError`."""
    check_parents(root)
    try:
        check_stat(root, os.stat(root))
    except FileNotFoundError:
        return
    for folder in folders:
        check_trusted(folder)
    for folder in files_in:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISLNK(st.st_mode):  # symlinks are never followed (refused by the reader)
                check_stat(Path(e.path), st, "file")


def find_untrusted(root: Path) -> list[UntrustedCacheError]:
    """Every path under (and above) a cache root that the backend would
    refuse: for ``fxpiece cache verify``."""
    found: list[UntrustedCacheError] = []

    def run(check: Callable[[], None]) -> None:
        try:
            check()
        except UntrustedCacheError as e:
            found.append(e)

    run(lambda: check_parents(root))
    if not root.is_dir():
        return found
    run(lambda: check_stat(root, os.stat(root)))
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            if CacheLayout.is_quarantined(name):
                continue  # moved aside: kept for inspection, never loaded
            path = Path(dirpath) / name
            try:
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    check_trusted(path)  # a symlink standing in for a folder is refused
                else:
                    check_stat(path, st, "file or folder")
            except UntrustedCacheError as e:
                found.append(e)
            except OSError:
                continue
    return found
