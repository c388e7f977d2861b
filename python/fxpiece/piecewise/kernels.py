"""Inductor's own cache folder, private to this backend and filled only from
verified bytes.

Inductor keeps compiled kernels (``.so``), generated Python and its FX-graph
cache in a folder it loads code from. fxpiece never points Inductor at a
folder anyone else can write: each :class:`~fxpiece.Backend` gets a fresh
0700 temporary folder (:class:`KernelDir`). What Inductor builds there while
a graph compiles (or rebuilds while it loads) is packed into one *kernel
bundle* stored as an ordinary, checksummed artifact and referenced from the
model's index; a warm start verifies the bundle and unpacks it into its own
private folder before loading any piece, so no C++ kernel is rebuilt and no
file planted under the cache root is ever loaded.

The kernels one piece's compile builds are bundled right after it
(:meth:`KernelDir.delta`, stored next to the piece's index entry), so other
processes loading the piece while this one still builds get them too; the
model's own bundle (:meth:`KernelDir.bundle`) then holds only the rest.

Bundle payload::

    FXPIECE-KERNELS v1\\n
    [["<relative path>", <size>], ...]\\n
    <the files' bytes, concatenated in that order>

>>> kd = KernelDir()
>>> _ = (kd.path / "ab").mkdir(); _ = (kd.path / "ab" / "k.so").write_bytes(b"elf")
>>> payload = kd.bundle()
>>> other = KernelDir(); other.unpack(payload), (other.path / "ab" / "k.so").read_bytes()
(1, b'elf')
>>> other.bundle() is None  # nothing new since the unpack
True
>>> _ = (kd.path / "ab" / "piece.so").write_bytes(b"elf2")
>>> delta = kd.delta()  # only what is new since the last bundle or delta
>>> other.unpack(delta, delta=True), kd.delta() is None, kd.bundle() is None
(1, True, True)

A bundle is checked whole before anything is written (here ``a`` would be a
file and a folder at once), and written through a temporary folder, so a bad
one leaves nothing behind:

>>> other.unpack(_MAGIC + b'[["a", 1], ["a/b", 1]]\\n' + b"xy")
Traceback (most recent call last):
...
fxpiece.errors.CorruptArtifactError: [Errno 22] kernel bundle: member 'a' is both a file ...
>>> sorted(p.name for p in other.path.iterdir())
['ab']
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import shutil
import stat
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path

from fxpiece.cache.layout import CacheLayout, safe_relpath
from fxpiece.cache.safeio import file_kind
from fxpiece.errors import CacheError, CorruptArtifactError

__all__ = ["BUNDLE_SKIP", "HEADERS_SUBDIR", "KernelDir"]

_MAGIC = b"FXPIECE-KERNELS v1\n"
HEADERS_SUBDIR = "precompiled_headers"
"""Where a backend keeps Inductor's precompiled headers when fxpiece's
host-wide private folder is refused (:mod:`fxpiece.piecewise.private_dirs`)."""
BUNDLE_SKIP = frozenset({"locks", "aotautograd", "fxgraph", HEADERS_SUBDIR})
"""Top folders of Inductor's cache never bundled: locks, the graph-cache
entries that every standalone artifact carries itself, and precompiled
headers (large, and rebuilt from the installed torch). A compiler whose
handles point into one of them lists it in ``inductor_cache_subdirs``."""


_NAME_MAX = 255
"""Longest file or folder name (bytes) a bundle member may have (Linux NAME_MAX)."""
_PATH_MAX = 4096
"""Longest path (bytes, with the trailing NUL) a member may be written at (Linux PATH_MAX)."""
_TMP_PREFIX = ".unpack-"
_TMP_LEN = 32
"""Bound on the length of the temporary folder's name :meth:`KernelDir.unpack` writes in."""
_PACK_TRIES = 3
_NEWLINE = re.compile(b"\n")
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MALFORMED_ERRNOS = frozenset(
    {errno.ENAMETOOLONG, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EINVAL, errno.ELOOP}
)
"""Write errors that say the member's name cannot be a file here (the bundle
is malformed); any other (no space, I/O) is a plain :class:`CacheError`."""


def _bad(why: str, where: str = "kernel bundle", path: str | None = None) -> CorruptArtifactError:
    return CorruptArtifactError(errno.EINVAL, f"{where}: {why}", path)


def _show(rel: str) -> str:
    """A member's name for a message (a hostile one may be long)."""
    text = repr(rel)
    return text if len(text) <= 80 else f"{text[:60]}...{text[-16:]} ({len(rel)} chars)"


def _pack(files: dict[str, Path]) -> bytes:
    """One payload of ``files``, read straight into the buffer that becomes
    the result (the payload is the only copy of the files' bytes in memory).
    A file removed meanwhile is left out; one that changes size while read
    restarts the packing; raises :class:`~fxpiece.errors.CacheError` if the
    files keep changing or cannot be read."""
    for _ in range(_PACK_TRIES):
        sizes: dict[str, int] = {}
        for rel, path in files.items():
            try:
                sizes[rel] = os.lstat(path).st_size
            except FileNotFoundError:
                continue  # removed since it was listed
            except OSError as e:
                raise _read_error(rel, path, e) from e
        head = b"".join([_MAGIC, json.dumps([[r, n] for r, n in sizes.items()]).encode(), b"\n"])
        out = io.BytesIO()
        out.write(head)
        total = len(head) + sum(sizes.values())
        if total > len(head):
            out.seek(total - 1)
            out.write(b"\0")  # sized once: the files are read into it below
        with out.getbuffer() as view:
            complete = _read_into(view, len(head), sizes, files)
        if complete:
            # An unshared BytesIO hands its buffer over without a copy.
            return out.getvalue()
    raise CacheError(
        errno.EAGAIN, "kernel bundle: the kernel files kept changing while being packed", None
    )


def _read_into(view: memoryview, at: int, sizes: dict[str, int], files: dict[str, Path]) -> bool:
    """Read each file of ``sizes`` into ``view`` from ``at`` on; ``False`` if
    one is gone or its size is not what ``sizes`` says (packed again)."""
    for rel, size in sizes.items():
        try:
            fd = os.open(files[rel], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise _read_error(rel, files[rel], e) from e
        try:
            got = 0
            while got < size:
                n = os.readv(fd, [view[at + got : at + size]])
                if n == 0:
                    return False  # shrank
                got += n
            if os.read(fd, 1):
                return False  # grew
        except OSError as e:
            raise _read_error(rel, files[rel], e) from e
        finally:
            os.close(fd)
        at += size
    return True


def _read_error(rel: str, path: Path, e: OSError) -> CacheError:
    return CacheError(
        e.errno or errno.EIO,
        f"kernel bundle: cannot read {_show(rel)}: {e.strerror or e}",
        str(path),
    )


class KernelDir:
    """A private (0700) folder for Inductor's cache, removed with this object."""

    def __init__(self, keep: Iterable[str] = ()) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="fxpiece-inductor-"))
        self.skip = BUNDLE_SKIP - set(keep)
        self._known: set[str] = set()
        """Files bundled, unpacked or in a delta: nothing new to store."""
        self._in_deltas: set[str] = set()
        """Files stored in (or unpacked from) a piece's delta: never in :meth:`bundle`."""
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.path), True)

    def files(self) -> dict[str, Path]:
        """Every regular file Inductor left here, by relative path."""
        out: dict[str, Path] = {}
        for dirpath, dirnames, filenames in os.walk(self.path):
            rel_dir = Path(dirpath).relative_to(self.path).as_posix()
            if rel_dir == ".":
                dirnames[:] = sorted(d for d in dirnames if d not in self.skip)
                rel_dir = ""
            for name in sorted(filenames):
                rel = f"{rel_dir}/{name}" if rel_dir else name
                full = Path(dirpath) / name
                if CacheLayout.is_bookkeeping(name) or not safe_relpath(rel):
                    continue
                if stat.S_ISREG(os.lstat(full).st_mode):
                    out[rel] = full
        return out

    def bundle(self) -> bytes | None:
        """All files here but those of pieces' deltas as one payload, or
        ``None`` when nothing is new since the last :meth:`bundle`,
        :meth:`delta` or :meth:`unpack`."""
        files = self.files()
        if set(files) <= self._known:
            return None
        payload = _pack({r: p for r, p in files.items() if r not in self._in_deltas})
        self._known |= set(files)
        return payload

    def delta(self) -> bytes | None:
        """The files that are new since the last :meth:`bundle`,
        :meth:`delta` or :meth:`unpack` (what one compile just built) as
        one payload, or ``None``."""
        new = {r: p for r, p in self.files().items() if r not in self._known}
        if not new:
            return None
        payload = _pack(new)
        self._known |= set(new)
        self._in_deltas |= set(new)
        return payload

    def unpack(
        self,
        payload: bytes | bytearray | memoryview,
        *,
        delta: bool = False,
        where: str = "kernel bundle",
    ) -> int:
        """Write a (verified) bundle's files that are not here yet (``delta``:
        a piece's, see :meth:`delta`); returns how many were written.

        Everything is checked before anything is written: a malformed bundle
        (bad header or manifest, sizes that do not add up, a member name that
        is unsafe, too long, a duplicate, both a file and a folder, under a
        folder never bundled, or taken here by something that is not a
        regular file) raises :class:`~fxpiece.errors.CorruptArtifactError`
        and writes nothing. The files are written into a fresh 0700 folder
        inside this one, then linked into place (never replacing a file: one
        already here is kept); if anything fails (also
        :class:`~fxpiece.errors.CacheError` naming ``where`` and the member,
        e.g. no space left) nothing of the bundle stays. The payload is
        written from slices of it, never copied."""
        view = memoryview(payload).cast("B")
        members = self._parse(view, where)
        todo = self._missing(view, members, where)
        written = self._write(todo, where) if todo else 0
        names = [rel for rel, _, _ in members]
        self._known.update(names)
        if delta:
            self._in_deltas.update(names)
        return written

    def _parse(self, view: memoryview, where: str) -> list[tuple[str, int, int]]:
        """``[(relative path, offset, size)]`` of a bundle's members, every
        one checked (see :meth:`unpack`); raises ``CorruptArtifactError``."""
        if view[: len(_MAGIC)] != _MAGIC:
            raise _bad("no header", where)
        newline = _NEWLINE.search(view, len(_MAGIC))
        if newline is None:
            raise _bad("no manifest", where)
        end = newline.start()
        try:
            manifest = json.loads(bytes(view[len(_MAGIC) : end]))
        except (ValueError, RecursionError):
            raise _bad("manifest is not JSON", where) from None
        if not isinstance(manifest, list):
            raise _bad("manifest entries must be [safe relative path, size]", where)
        members: list[tuple[str, int, int]] = []
        folders: set[str] = set()
        names: set[str] = set()
        at = end + 1
        for m in manifest:
            if not (
                isinstance(m, list)
                and len(m) == 2
                and isinstance(m[0], str)
                and isinstance(m[1], int)
                and not isinstance(m[1], bool)
                and m[1] >= 0
            ):
                raise _bad("manifest entries must be [safe relative path, size]", where)
            rel, size = m
            why = self._bad_name(rel)
            if why is None and rel in names:
                why = "listed twice"
            if why is not None:
                raise _bad(f"member {_show(rel)} {why}", where)
            names.add(rel)
            parts = rel.split("/")
            folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
            members.append((rel, at, size))
            at += size
        if at != len(view):
            raise _bad("sizes do not add up to the payload", where)
        both = names & folders
        if both:
            raise _bad(f"member {_show(min(both))} is both a file and a folder", where)
        return members

    def _bad_name(self, rel: str) -> str | None:
        """Why ``rel`` cannot be a member written here, or ``None``."""
        if not safe_relpath(rel):
            return "is not a safe relative path"
        if rel.split("/")[0] in self.skip:
            return "is under a folder never bundled"
        try:
            raw = os.fsencode(rel)
        except UnicodeEncodeError:
            return "is not a valid file name"
        if any(len(part) > _NAME_MAX for part in raw.split(b"/")):
            return f"has a name over {_NAME_MAX} bytes"
        if len(os.fsencode(self.path)) + _TMP_LEN + len(raw) + 3 > _PATH_MAX:
            return f"makes a path over {_PATH_MAX} bytes"
        return None

    def _missing(
        self, view: memoryview, members: list[tuple[str, int, int]], where: str
    ) -> list[tuple[str, memoryview]]:
        """The members not here yet, with their bytes (slices of ``view``);
        raises ``CorruptArtifactError`` if something that is not a regular
        file (a folder, a symlink) is in a member's place, or a member's
        folder is a file here."""
        kinds: dict[str, int | None] = {}

        def kind(rel: str) -> int | None:
            if rel not in kinds:
                try:
                    kinds[rel] = os.lstat(self.path / rel).st_mode
                except (FileNotFoundError, NotADirectoryError):
                    kinds[rel] = None
                except OSError as e:
                    raise self._write_error(rel, self.path / rel, e, where) from e
            return kinds[rel]

        todo: list[tuple[str, memoryview]] = []
        for rel, at, size in members:
            parts = rel.split("/")
            for i in range(1, len(parts)):
                folder = "/".join(parts[:i])
                mode = kind(folder)
                if mode is None:
                    break
                if not stat.S_ISDIR(mode):
                    raise _bad(
                        f"member {_show(rel)}: {folder!r} is {file_kind(mode)} here, not a folder",
                        where,
                        str(self.path / folder),
                    )
            else:
                mode = kind(rel)
                if mode is not None:
                    if stat.S_ISREG(mode):
                        continue  # already here: kept
                    raise _bad(
                        f"member {_show(rel)}: {file_kind(mode)} is in its place here",
                        where,
                        str(self.path / rel),
                    )
            todo.append((rel, view[at : at + size]))
        return todo

    def _write(self, todo: list[tuple[str, memoryview]], where: str) -> int:
        """Write ``todo`` into a fresh folder inside this one, then link each
        file into place; on any failure remove what was placed and the
        folders made for it (nothing of the bundle stays). How many were placed."""
        try:
            tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=self.path))
        except OSError as e:
            raise CacheError(
                e.errno or errno.EIO,
                f"{where}: cannot make a folder in {self.path}: {e.strerror or e}",
                str(self.path),
            ) from e
        placed: list[Path] = []
        made: list[Path] = []
        try:
            for rel, data in todo:
                try:
                    _write_file(tmp, rel, data)
                except OSError as e:
                    raise self._write_error(rel, tmp / rel, e, where) from e
            for rel, _ in todo:
                try:
                    if self._place(tmp / rel, rel, made):
                        placed.append(self.path / rel)
                except OSError as e:
                    raise self._write_error(rel, self.path / rel, e, where) from e
        except BaseException:
            for path in reversed(placed):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return len(placed)

    def _place(self, src: Path, rel: str, made: list[Path]) -> bool:
        """Link ``src`` to ``rel`` here, making its missing folders (0700,
        appended to ``made``); never replaces a file (``False``: a regular
        file appeared there meanwhile, kept)."""
        dest = self.path / rel
        folder = self.path
        for part in rel.split("/")[:-1]:
            folder = folder / part
            try:
                os.mkdir(folder, 0o700)
                made.append(folder)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(folder).st_mode):
                    raise
        try:
            os.link(src, dest, follow_symlinks=False)
        except FileExistsError:
            if stat.S_ISREG(os.lstat(dest).st_mode):
                return False
            raise
        return True

    def _write_error(self, rel: str, path: Path, e: OSError, where: str) -> CacheError:
        why = f"cannot write member {_show(rel)} in {self.path}: {e.strerror or e}"
        if e.errno in _MALFORMED_ERRNOS:
            return _bad(why, where, str(path))
        return CacheError(e.errno or errno.EIO, f"{where}: {why}", str(path))


def _write_file(tmp: Path, rel: str, data: memoryview) -> None:
    """Create ``tmp/rel`` (0700, folders too) holding ``data``, written from
    the view itself."""
    dest = tmp / rel
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(dest, _WRITE_FLAGS, 0o700)
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
