"""The format of a cache archive: a tar led by ``manifest.json`` (format,
version, every file's relative path, size and BLAKE3), and the checks an
archive must pass before anything of it is written.

Archives are read with :class:`ArchiveTarInfo`, which refuses sparse members
(old GNU ``S`` and the ``GNU.sparse`` PAX formats) and oversized extended
headers while the header is parsed, before :mod:`tarfile` expands a sparse
map or reads a header into memory.
"""

from __future__ import annotations

import errno
import json
import posixpath
import tarfile
import time
from pathlib import Path
from typing import Any

from fxpiece.cache.layout import CacheLayout, safe_relpath
from fxpiece.errors import CacheError

__all__ = [
    "MANIFEST",
    "PACK_FORMAT",
    "PACK_VERSION",
    "ArchiveError",
    "ArchiveTarInfo",
    "UnsafeHeader",
    "archive_tops",
    "is_sparse",
    "make_manifest",
    "member_info",
    "member_limit",
    "read_manifest",
    "refuse",
    "unpack_path_ok",
]

PACK_FORMAT = "fxpiece-cache"
PACK_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_LIMIT = 256 * 1024 * 1024
"""Largest manifest read (bytes)."""
HEADER_LIMIT = 1024 * 1024
"""Largest extended header (PAX, GNU long name) read (bytes)."""
LEAD_LIMIT = 1000
"""Most members read while looking for the manifest (``pack`` writes it first)."""


class ArchiveError(CacheError):
    """A cache archive is malformed, unsafe (absolute paths, ``..``, links,
    sparse files) or does not match its manifest; nothing was written.
    ``member`` names the archive member refused, when there is one."""

    member: str | None = None


def refuse(archive: Path, why: str, member: str | None = None) -> ArchiveError:
    e = ArchiveError(errno.EINVAL, f"refusing {archive}: {why}; nothing was written", str(archive))
    e.member = member
    return e


class UnsafeHeader(Exception):
    """Raised by :class:`ArchiveTarInfo` while :mod:`tarfile` parses a header.
    Deliberately not an ``OSError`` or ``TarError``: :mod:`tarfile` would
    swallow those into "not a gzip file"."""

    def __init__(self, why: str, member: str | None) -> None:
        super().__init__(why)
        self.why, self.member = why, member


class ArchiveTarInfo(tarfile.TarInfo):
    """The :class:`tarfile.TarInfo` an archive is read with (``tarinfo=``):
    a sparse member is refused before its map is read (an old GNU sparse
    member's extension blocks, a PAX 1.0 map in the data), and an extended
    header over :data:`HEADER_LIMIT` before it is read into memory.
    :mod:`tarfile` documents ``_proc_member`` as the hook for subclasses;
    the ``_proc_gnusparse_*`` overrides are belt and braces (the members are
    checked for sparseness again after parsing)."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise UnsafeHeader(f"{self.name!r:.200} is a sparse file (GNU 'S')", self.name)
        extended = (
            tarfile.GNUTYPE_LONGNAME,
            tarfile.GNUTYPE_LONGLINK,
            tarfile.XHDTYPE,
            tarfile.XGLTYPE,
            tarfile.SOLARIS_XHDTYPE,
        )
        if self.type in extended and self.size > HEADER_LIMIT:
            raise UnsafeHeader(
                f"an extended header of {self.size} bytes at offset {self.offset} "
                f"(at most {HEADER_LIMIT})",
                None,
            )
        info: tarfile.TarInfo = super()._proc_member(tarfile_)  # type: ignore[misc]
        return info

    @staticmethod
    def _sparse(next_: tarfile.TarInfo, pax_headers: dict[str, str]) -> UnsafeHeader:
        name = pax_headers.get("GNU.sparse.name") or pax_headers.get("path") or next_.name
        return UnsafeHeader(f"{name!r:.200} is a sparse file (GNU.sparse PAX headers)", name)

    def _proc_gnusparse_00(self, next_: tarfile.TarInfo, pax: dict[str, str], _buf: bytes) -> None:
        raise self._sparse(next_, pax)

    def _proc_gnusparse_01(self, next_: tarfile.TarInfo, pax: dict[str, str]) -> None:
        raise self._sparse(next_, pax)

    def _proc_gnusparse_10(self, next_: tarfile.TarInfo, pax: dict[str, str], _tf: Any) -> None:
        raise self._sparse(next_, pax)


def is_sparse(m: tarfile.TarInfo) -> bool:
    """A sparse member, in any tar sparse format."""
    return (
        m.type == tarfile.GNUTYPE_SPARSE
        or m.sparse is not None
        or any(k.startswith("GNU.sparse.") for k in m.pax_headers)
    )


def archive_tops(layout: CacheLayout) -> tuple[Path, ...]:
    """The folders of a cache that an archive holds (``artifacts/``,
    ``models/``; Inductor's kernels travel inside the artifacts)."""
    return (layout.artifacts_dir, layout.models_dir)


def unpack_path_ok(name: str) -> bool:
    """A safe path of a file inside one of the folders an archive may hold."""
    top, sep, _rest = name.partition("/")
    tops = {p.name for p in archive_tops(CacheLayout("."))}
    return bool(sep) and safe_relpath(name) and top in tops


def unpack_dir_ok(name: str) -> bool:
    """A safe folder path: one of those folders or inside one."""
    tops = {p.name for p in archive_tops(CacheLayout("."))}
    return safe_relpath(name) and name.partition("/")[0] in tops


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("fxpiece")
    except Exception:
        return "unknown"


def make_manifest(files: list[dict[str, Any]]) -> bytes:
    manifest = {
        "format": PACK_FORMAT,
        "version": PACK_VERSION,
        "created": time.time(),
        "fxpiece": _version(),
        "files": files,
    }
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def member_info(name: str, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = int(mtime)
    info.mode = 0o600
    info.type = tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _find_manifest(tar: tarfile.TarFile, archive: Path) -> tarfile.TarInfo:
    """The manifest member, looked for among the first :data:`LEAD_LIMIT`
    members only (headers are read lazily: no more are loaded)."""
    for i, m in enumerate(tar):
        if m.name == MANIFEST:
            return m
        if i + 1 >= LEAD_LIMIT:
            raise refuse(archive, f"no {MANIFEST} among the first {LEAD_LIMIT} members")
    raise refuse(archive, f"no {MANIFEST} (not an fxpiece cache archive)")


def _load(tar: tarfile.TarFile, archive: Path) -> dict[str, Any]:
    member = _find_manifest(tar, archive)
    fobj = tar.extractfile(member) if member.isreg() and not is_sparse(member) else None
    if fobj is None or member.size > MANIFEST_LIMIT:
        raise refuse(archive, f"{MANIFEST} is not a regular file of sane size")
    try:
        manifest = json.loads(fobj.read())
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise refuse(archive, f"{MANIFEST} is not JSON ({why})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != PACK_FORMAT:
        raise refuse(archive, f"{MANIFEST} is not an {PACK_FORMAT} manifest")
    if manifest.get("version") != PACK_VERSION:
        raise refuse(
            archive,
            f"archive format version {manifest.get('version')!r:.40}; this fxpiece reads "
            f"version {PACK_VERSION}",
        )
    return manifest


def _entry_ok(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    size, b3 = item.get("size"), item.get("blake3")
    return (
        isinstance(size, int) and not isinstance(size, bool) and size >= 0 and isinstance(b3, str)
    )


def read_manifest(tar: tarfile.TarFile, archive: Path) -> dict[str, dict[str, Any]]:
    """The files the manifest lists (path -> entry), or :class:`ArchiveError`."""
    entries = _load(tar, archive).get("files")
    if not isinstance(entries, list):
        raise refuse(archive, f"{MANIFEST} has no file list")
    files: dict[str, dict[str, Any]] = {}
    for item in entries:
        p = item.get("path") if isinstance(item, dict) else None
        if not isinstance(p, str) or not unpack_path_ok(p):
            raise refuse(archive, f"unsafe or unexpected path {p!r:.200} in {MANIFEST}")
        if not _entry_ok(item) or p in files:
            raise refuse(archive, f"bad manifest entry for {p!r}")
        files[p] = item
    return files


def member_limit(files: dict[str, dict[str, Any]]) -> int:
    """Most members an archive of these files may hold: the manifest, the
    files, and one member per folder on their paths (``tar`` lists them)."""
    folders: set[str] = set()
    for p in files:
        d = posixpath.dirname(p)
        while d and d not in folders:
            folders.add(d)
            d = posixpath.dirname(d)
    return 1 + len(files) + len(folders)
