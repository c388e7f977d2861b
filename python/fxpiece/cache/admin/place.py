"""Placing staged files into a cache root: all of them, or none.

:func:`move_all` checks every destination before anything moves (no
folder on the way may be a symlink or a file, no destination a folder,
symlink or device), then renames the staged files into place one by one;
if one fails, the ones already moved are put back as they were (a replaced
file from a hard link or copy kept in the staging folder) and the folders
it created are removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from fxpiece.cache.admin.scan import lstat
from fxpiece.cache.safeio import file_kind
from fxpiece.errors import CacheError

__all__ = ["move_all"]


def _not_a_folder(path: Path) -> CacheError:
    return CacheError(
        errno.ENOTDIR,
        f"{path} is a symlink or a file, not a folder; refusing to write through it; "
        "nothing was written",
        str(path),
    )


def _check_destination(root: Path, name: str) -> None:
    """Refuse before anything moves: a folder on the way that is a symlink
    or a file, or a destination that exists and is not a regular file."""
    cur = root
    for part in name.split("/")[:-1]:
        cur = cur / part
        st = lstat(cur)
        if st is None:
            return  # created by the move
        if not stat.S_ISDIR(st.st_mode):
            raise _not_a_folder(cur)
    dest = root / name
    st = lstat(dest)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise CacheError(
            errno.EEXIST,
            f"{dest} is {file_kind(st.st_mode)}, not a regular file; nothing was written",
            str(dest),
        )


def _mkdirs_private(root: Path, rel_dir: str, made: list[Path]) -> Path:
    """Create ``root/rel_dir`` one part at a time (0700), refusing to go
    through a symlink or a non-folder; the folders created go to ``made``."""
    cur = root
    for part in [p for p in rel_dir.split("/") if p]:
        cur = cur / part
        try:
            os.mkdir(cur, 0o700)
            made.append(cur)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(cur).st_mode):
                raise _not_a_folder(cur) from None
    return cur


def _keep_old(dest: Path, backup: Path) -> Path | None:
    """A copy of the file at ``dest`` (a hard link if possible), or ``None``."""
    if lstat(dest) is None:
        return None
    try:
        os.link(dest, backup)
    except OSError:
        shutil.copyfile(dest, backup)
    return backup


def move_all(root: Path, todo: Sequence[tuple[str, Path]], staging: Path) -> None:
    """Rename every staged file into place, or none: on a failure, what was
    moved is put back as it was."""
    for name, _ in todo:
        _check_destination(root, name)
    done: list[tuple[Path, Path | None]] = []
    made: list[Path] = []
    try:
        for i, (name, tmp) in enumerate(todo):
            dest = _mkdirs_private(root, posixpath.dirname(name), made) / posixpath.basename(name)
            backup = _keep_old(dest, staging / f"old-{i:08d}")
            os.replace(tmp, dest)
            done.append((dest, backup))
    except BaseException:
        for dest, backup in reversed(done):
            with contextlib.suppress(OSError):
                if backup is None:
                    os.unlink(dest)
                else:
                    os.replace(backup, dest)
        for d in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        raise
