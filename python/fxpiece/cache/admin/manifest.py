"""The format of a cache archive: a tar led by ``manifest.json`` (format,
version, every file's relative path, size and BLAKE3), and the checks an
archive must pass before anything of it is written."""

from __future__ import annotations

import errno
import json
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
    "archive_tops",
    "make_manifest",
    "member_info",
    "read_manifest",
    "refuse",
    "unpack_path_ok",
]

PACK_FORMAT = "fxpiece-cache"
PACK_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_LIMIT = 256 * 1024 * 1024
"""Largest manifest read (bytes)."""


class ArchiveError(CacheError):
    """A cache archive is malformed, unsafe (absolute paths, ``..``, links)
    or does not match its manifest; nothing was written."""


def refuse(archive: Path, why: str) -> ArchiveError:
    return ArchiveError(
        errno.EINVAL, f"refusing {archive}: {why}; nothing was written", str(archive)
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


def _load(tar: tarfile.TarFile, archive: Path) -> dict[str, Any]:
    try:
        member = tar.getmember(MANIFEST)
    except KeyError:
        raise refuse(archive, f"no {MANIFEST} (not an fxpiece cache archive)") from None
    fobj = tar.extractfile(member) if member.isreg() else None
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
