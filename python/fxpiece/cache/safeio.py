"""Reading files under a cache root that may be hostile.

A file under the root may be a FIFO (opening it would block forever), a
device (``/dev/zero`` reads forever), a symlink (out of the root), a folder,
or huge. :func:`read_regular` opens without following a final symlink and
without blocking, accepts regular files only and reads at most ``limit``
bytes; anything else raises :class:`~fxpiece.errors.HostileFileError`.

>>> import os, tempfile
>>> d = tempfile.mkdtemp(); fifo = os.path.join(d, "f"); os.mkfifo(fifo)
>>> read_regular(fifo, 10)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fxpiece.errors.HostileFileError: [Errno 22] .../f is a FIFO, not a regular file: ...
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator

from fxpiece.errors import HostileFileError

__all__ = ["file_kind", "open_regular", "read_exact", "read_regular"]

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symlink"),
)


def file_kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


@contextlib.contextmanager
def open_regular(
    path: str | os.PathLike[str],
    limit: int,
    check: Callable[[os.stat_result], None] | None = None,
) -> Iterator[tuple[int, os.stat_result]]:
    """``(fd, fstat)`` of the regular file at ``path``, opened for reading and
    closed when the block ends; the same checks as :func:`read_regular`
    (never a symlink, FIFO, device, socket or folder; ``check``; at most
    ``limit`` bytes by its size)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise HostileFileError(
                errno.ELOOP, f"{os.fspath(path)} is a symlink, not a regular file", str(path)
            ) from None
        if e.errno in (errno.ENXIO, errno.EISDIR):
            st = os.lstat(path)
            raise HostileFileError(
                errno.EINVAL,
                f"{os.fspath(path)} is {file_kind(st.st_mode)}, not a regular file",
                str(path),
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HostileFileError(
                errno.EINVAL,
                f"{os.fspath(path)} is {file_kind(st.st_mode)}, not a regular file",
                str(path),
            )
        if check is not None:
            check(st)
        if st.st_size > limit:
            raise HostileFileError(
                errno.EFBIG,
                f"{os.fspath(path)} is {st.st_size} bytes, over the {limit}-byte limit",
                str(path),
            )
        yield fd, st
    finally:
        os.close(fd)


def read_regular(
    path: str | os.PathLike[str],
    limit: int,
    check: Callable[[os.stat_result], None] | None = None,
) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``limit``).

    Raises :class:`~fxpiece.errors.HostileFileError` (a ``CacheError``) for
    a symlink, FIFO, device, socket, folder or a file over ``limit``, and
    ``FileNotFoundError`` if nothing is there. ``check`` is called with the
    opened file's ``fstat`` before anything is read (e.g. the trust check)."""
    with open_regular(path, limit, check) as (fd, _st):
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise HostileFileError(
                errno.EFBIG, f"{os.fspath(path)} grew past the {limit}-byte limit", str(path)
            )
        return data


def read_exact(fd: int, size: int, offset: int, path: str | os.PathLike[str]) -> bytearray:
    """Exactly ``size`` bytes of the open file ``fd`` from ``offset``, read
    straight into one buffer (no other copy: a large artifact costs its own
    size); :class:`~fxpiece.errors.HostileFileError` if the file ends early
    or goes on past them (it changed while being read)."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = os.preadv(fd, [view[got : got + (64 << 20)]], offset + got)
        if n == 0:
            raise HostileFileError(
                errno.EINVAL, f"{os.fspath(path)} shrank while it was read", str(path)
            )
        got += n
    view.release()
    if os.pread(fd, 1, offset + size):
        raise HostileFileError(errno.EFBIG, f"{os.fspath(path)} grew while it was read", str(path))
    return buf
