"""Folders only we write, for what Inductor keeps outside its cache folder.

Inductor's cache folder is fxpiece's private :class:`~fxpiece.piecewise.kernels.KernelDir`,
but Inductor also keeps state in *global* folders that ``TORCHINDUCTOR_CACHE_DIR``
does not move: on CPU, precompiled C++ headers under
``<TMPDIR>/torchinductor_<user>/precompiled_headers`` (an existing ``.h`` is never
rewritten and a missing ``.h.gch`` is rebuilt from it, and every kernel is
compiled with ``-include`` of it). Anyone who creates that folder first (it is in
a world-writable ``/tmp``) can put code into every kernel we build. fxpiece
points those folders (see :func:`fxpiece.piecewise._torch_compat.inductor_dirs`)
at :func:`host_private_dir`: ``<TMPDIR>/fxpiece-<uid>``, created 0700 and checked
before each use, and kept between processes so the headers are built once per
host and user, as Inductor's own are.

>>> import os
>>> d = host_private_dir()
>>> d.name == f"fxpiece-{os.getuid()}", oct(d.stat().st_mode & 0o777)
(True, '0o700')
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from fxpiece.cache.trust import check_parents, check_stat
from fxpiece.errors import UntrustedCacheError

__all__ = ["headers_dir", "host_private_dir", "untrusted"]


def _refuse(path: Path, why: str) -> UntrustedCacheError:
    return UntrustedCacheError(
        errno.EPERM,
        f"{path} {why}; fxpiece keeps Inductor's precompiled C++ headers there (code that "
        f"goes into every kernel), so it must be a folder only you can write. Fix: remove it "
        f"(rm -rf {path}) and fxpiece creates it again, or point TMPDIR at a folder of yours",
        str(path),
    )


def host_private_dir(base: Path | None = None) -> Path:
    """``<base>/fxpiece-<uid>`` (``base``: the temp folder), created 0700 and
    checked: a real folder (no symlink), owned by you, writable by nobody else,
    under parents nobody else can swap. Raises
    :class:`~fxpiece.errors.UntrustedCacheError` naming the path and the fix."""
    path = Path(base if base is not None else tempfile.gettempdir()) / f"fxpiece-{os.getuid()}"
    check_parents(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise _refuse(path, f"cannot be created ({e.strerror})") from e
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a folder (a symlink or a file stands in its place)")
    if st.st_uid != os.getuid():
        raise _refuse(path, f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
    check_stat(path, st, "fxpiece's private folder")
    return path


def headers_dir(fallback: Path, base: Path | None = None) -> tuple[Path, str | None]:
    """Where Inductor's precompiled headers go: ``host_private_dir()/precompiled_headers``,
    or, when that folder is refused (someone else created it first), ``fallback``
    (a folder private to one backend: the headers are then rebuilt per backend)
    and the reason, for a warning."""
    try:
        folder = host_private_dir(base) / "precompiled_headers"
    except UntrustedCacheError as e:
        return fallback, str(e)
    folder.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return fallback, str(_refuse(folder, "is not a folder of yours"))
    return folder, None


def untrusted(folder: Path) -> UntrustedCacheError | None:
    """Why ``folder`` (one of Inductor's own, which fxpiece cannot move for
    code it does not drive) could hold another user's files, or ``None``: a
    symlink, another owner, group or world write, or a parent someone else
    could swap. A folder that does not exist is fine."""
    try:
        check_parents(folder)
        st = os.lstat(folder)
        if stat.S_ISLNK(st.st_mode):
            return _refuse(folder, "is a symlink")
        check_stat(folder, st, "Inductor's default folder")
    except FileNotFoundError:
        return None
    except UntrustedCacheError as e:
        return e
    return None
