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
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path

from fxpiece.cache.layout import CacheLayout, safe_relpath
from fxpiece.errors import CorruptArtifactError

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


def _bad(why: str) -> CorruptArtifactError:
    return CorruptArtifactError(errno.EINVAL, f"kernel bundle: {why}", None)


def _pack(files: dict[str, Path]) -> bytes:
    blobs = [p.read_bytes() for p in files.values()]
    manifest = [[rel, len(b)] for rel, b in zip(files, blobs, strict=True)]
    return b"".join([_MAGIC, json.dumps(manifest).encode(), b"\n", *blobs])


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
        self._known |= set(files)
        return _pack({r: p for r, p in files.items() if r not in self._in_deltas})

    def delta(self) -> bytes | None:
        """The files that are new since the last :meth:`bundle`,
        :meth:`delta` or :meth:`unpack` (what one compile just built) as
        one payload, or ``None``."""
        new = {r: p for r, p in self.files().items() if r not in self._known}
        if not new:
            return None
        self._known |= set(new)
        self._in_deltas |= set(new)
        return _pack(new)

    def unpack(self, payload: bytes, *, delta: bool = False) -> int:
        """Write a (verified) bundle's files that are not here yet (``delta``:
        a piece's, see :meth:`delta`); returns how many were written. A
        malformed bundle raises :class:`~fxpiece.errors.CorruptArtifactError`
        and writes nothing."""
        if not payload.startswith(_MAGIC):
            raise _bad("no header")
        end = payload.find(b"\n", len(_MAGIC))
        if end < 0:
            raise _bad("no manifest")
        try:
            manifest = json.loads(payload[len(_MAGIC) : end])
        except (ValueError, RecursionError):
            raise _bad("manifest is not JSON") from None
        if not isinstance(manifest, list) or not all(
            isinstance(m, list)
            and len(m) == 2
            and isinstance(m[0], str)
            and safe_relpath(m[0])
            and m[0].split("/")[0] not in self.skip
            and isinstance(m[1], int)
            and not isinstance(m[1], bool)
            and m[1] >= 0
            for m in manifest
        ):
            raise _bad("manifest entries must be [safe relative path, size]")
        body = memoryview(payload)[end + 1 :]
        if sum(m[1] for m in manifest) != len(body):
            raise _bad("sizes do not add up to the payload")
        written = 0
        offset = 0
        for rel, size in manifest:
            data = body[offset : offset + size]
            offset += size
            self._known.add(rel)
            if delta:
                self._in_deltas.add(rel)
            dest = self.path / rel
            if dest.exists():
                continue
            dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o700)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            written += 1
        return written
