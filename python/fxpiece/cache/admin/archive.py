"""``fxpiece cache pack`` / ``unpack``: move a cache between machines as
one archive with a checksummed manifest (:mod:`.manifest`).

The manifest's checksums say the archive arrived as it was packed, not who
built what it holds: ``unpack`` also requires every artifact in it to be a
signed ``v3`` file whose signer is trusted (:func:`~fxpiece.signing.trusted_keys`,
plus the keys given with ``--trust KEY`` for this unpack), or refuses the
whole archive before anything is written. Unsigned (pre-``v3``) artifacts
are refused: no key vouches for them.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import lzma
import os
import secrets
import shutil
import stat
import tarfile
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fxpiece.cache.admin.manifest import (
    MANIFEST,
    ArchiveTarInfo,
    UnsafeHeader,
    archive_tops,
    is_sparse,
    make_manifest,
    member_info,
    member_limit,
    read_manifest,
    refuse,
    unpack_dir_ok,
    unpack_path_ok,
)
from fxpiece.cache.admin.place import move_all
from fxpiece.cache.admin.scan import lstat
from fxpiece.cache.layout import CacheLayout, safe_relpath
from fxpiece.cache.safeio import file_kind
from fxpiece.cache.store import check_artifact_signer, read_artifact
from fxpiece.errors import CacheError
from fxpiece.hashing import hash_files_report
from fxpiece.signing import PublicKey, TrustedKeys, trusted_keys

__all__ = ["PackResult", "UnpackResult", "pack_cache", "unpack_cache"]


@dataclass(frozen=True, slots=True)
class PackResult:
    """The archive :func:`pack_cache` wrote."""

    archive: Path
    files: int
    bytes: int
    """Total size of the packed files (before compression)."""
    archive_bytes: int
    skipped: tuple[str, ...] = ()
    """Paths left out: symlinks (never followed) and unreadable files."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "archive": str(self.archive),
            "files": self.files,
            "bytes": self.bytes,
            "archive_bytes": self.archive_bytes,
            "skipped": list(self.skipped),
        }


@dataclass(frozen=True, slots=True)
class UnpackResult:
    """What :func:`unpack_cache` wrote."""

    root: Path
    written: int
    unchanged: int
    """Files already present with the same content."""
    bytes: int
    signers: tuple[tuple[PublicKey, int], ...] = ()
    """Who signed the archive's artifacts, and how many each."""
    not_trusted_for_loads: tuple[PublicKey, ...] = ()
    """Signers accepted only through ``--trust`` (``extra_trust``): loads
    refuse their artifacts until they are trusted (``fxpiece key trust
    KEY`` or ``FXPIECE_TRUSTED_KEYS``)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "written": self.written,
            "unchanged": self.unchanged,
            "bytes": self.bytes,
            "signers": {str(k): n for k, n in self.signers},
            "not_trusted_for_loads": [str(k) for k in self.not_trusted_for_loads],
        }


# -- pack -------------------------------------------------------------------------


def _walk(layout: CacheLayout, base: Path, skipped: list[str]) -> Iterable[str]:
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        rel_dir = Path(dirpath).relative_to(layout.root).as_posix()
        keep = []
        for d in sorted(dirnames):
            if os.path.islink(os.path.join(dirpath, d)):
                skipped.append(f"{rel_dir}/{d} (symlink)")
            elif d != layout.locks_dir.name and not d.startswith("."):
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            st = lstat(os.path.join(dirpath, name))
            rel = f"{rel_dir}/{name}"
            if CacheLayout.is_bookkeeping(name) or st is None:
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped.append(f"{rel} ({'symlink' if stat.S_ISLNK(st.st_mode) else 'special'})")
            elif not safe_relpath(rel):
                skipped.append(f"{rel} (unsafe name)")
            else:
                yield rel


def _pack_files(layout: CacheLayout, tops: Iterable[Path], skipped: list[str]) -> list[str]:
    out: list[str] = []
    for base in tops:
        if base.is_symlink():
            skipped.append(f"{base.name} (symlink)")
        elif base.is_dir():
            out.extend(_walk(layout, base, skipped))
    return out


def _tar_mode(path: Path, writing: bool) -> str:
    name = path.name.lower()
    comp = ""
    if name.endswith((".tar.gz", ".tgz")):
        comp = "gz"
    elif name.endswith((".tar.bz2", ".tbz2")):
        comp = "bz2"
    elif name.endswith((".tar.xz", ".txz")):
        comp = "xz"
    if writing:
        return f"w:{comp}" if comp else "w"
    return "r:*"


def _check_target(root: Path, out: Path) -> None:
    """Refuse an archive path inside the cache, or one that is not (absent
    or) a regular file: a device, FIFO, folder or symlink is never replaced."""
    out_abs, root_abs = out.resolve(), root.resolve()
    if out_abs == root_abs or root_abs in out_abs.parents:
        raise CacheError(
            errno.EINVAL, f"write the archive outside the cache folder {root}", str(out)
        )
    st = lstat(out)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise CacheError(
            errno.EEXIST,
            f"{out} is {file_kind(st.st_mode)}, not a regular file; refusing to replace it",
            str(out),
        )


def _open_packed(path: Path, size: int) -> IO[bytes]:
    """The regular file at ``path``, still of the size the manifest says."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    src = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        src.close()
        raise CacheError(errno.EAGAIN, f"{path} changed while packing; pack again", str(path))
    return src


def _manifest_files(root: Path, rels: list[str], skipped: list[str]) -> list[dict[str, Any]]:
    report = hash_files_report([str(root / r) for r in rels]) if rels else None
    by_path = {f.path: f for f in report.files} if report else {}
    files: list[dict[str, Any]] = []
    for rel in rels:
        f = by_path.get(str(root / rel))
        if f is None or f.digest is None:
            skipped.append(f"{rel} (unreadable: {f.skipped if f else 'vanished'})")
            continue
        files.append({"path": rel, "size": f.size, "blake3": f.digest})
    return files


def _write_tar(root: Path, out: Path, body: bytes, files: list[dict[str, Any]]) -> None:
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(6)}")
    try:
        with open(tmp, "xb") as raw:
            mode = _tar_mode(out, True)
            with tarfile.open(fileobj=raw, mode=mode, format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                tar.addfile(member_info(MANIFEST, len(body), time.time()), io.BytesIO(body))
                for entry in files:
                    with _open_packed(root / entry["path"], entry["size"]) as src:
                        mtime = os.fstat(src.fileno()).st_mtime
                        tar.addfile(member_info(entry["path"], entry["size"], mtime), src)
            raw.flush()
            os.fsync(raw.fileno())
        _check_target(root, out)  # nothing took its place meanwhile
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def pack_cache(
    root: str | os.PathLike[str],
    out_file: str | os.PathLike[str],
) -> PackResult:
    """Write the cache (``artifacts/``, ``models/``: compiled pieces and
    their kernel bundles, so a new machine rebuilds nothing) into one tar
    archive, gzip/bz2/xz by suffix (``.tar.gz``, ``.tgz``...), led by
    ``manifest.json`` (format version, every file's relative path, size and
    BLAKE3).

    Paths are relative; symlinks are never followed (they are left out and
    listed in ``skipped``); locks, leases, temp and quarantined files are
    left out. The archive is written atomically (temp file + rename); an
    existing ``out_file`` that is not a regular file is refused, untouched.
    """
    layout = CacheLayout(root)
    out = Path(out_file)
    if not layout.root.is_dir():
        raise CacheError(errno.ENOENT, f"no fxpiece cache at {layout.root}", str(layout.root))
    _check_target(layout.root, out)
    skipped: list[str] = []
    rels = _pack_files(layout, archive_tops(layout), skipped)
    files = _manifest_files(layout.root, rels, skipped)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_tar(layout.root, out, make_manifest(files), files)
    return PackResult(
        archive=out,
        files=len(files),
        bytes=sum(int(e["size"]) for e in files),
        archive_bytes=out.stat().st_size,
        skipped=tuple(skipped),
    )


# -- unpack -----------------------------------------------------------------------

CHUNK = 1 << 20
"""Bytes read from the archive and written to the staging folder at a time."""
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _why(e: BaseException) -> str:
    return str(e).splitlines()[0].rstrip(":") if str(e) else type(e).__name__


_UNREADABLE = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)
"""What reading a broken or truncated archive raises."""


def _not_a_file(m: tarfile.TarInfo) -> str | None:
    """Why the member ``m`` is not a regular file we unpack, or ``None``."""
    if is_sparse(m):
        return "is a sparse file"
    if m.islnk():
        return f"is a hard link (to {m.linkname!r:.200})"
    if m.issym():
        return f"is a symbolic link (to {m.linkname!r:.200})"
    if m.ischr() or m.isblk():
        return "is a device"
    if m.isfifo():
        return "is a FIFO"
    if not m.isreg():
        return "is a folder or special file"
    return None


def _check_members(
    tar: tarfile.TarFile, arc: Path, files: dict[str, dict[str, Any]]
) -> list[tarfile.TarInfo]:
    """The file members, each checked against the manifest, headers only
    (nothing is extracted); every listed file must be there exactly once,
    and no more members than :func:`member_limit` are even read."""
    limit = member_limit(files)
    out: dict[str, tarfile.TarInfo] = {}
    manifests = 0
    for i, m in enumerate(tar):
        if i >= limit:
            raise refuse(
                arc,
                f"more than {limit} members (a manifest of {len(files)} files and their "
                f"folders); refused at {m.name!r:.200}",
                m.name,
            )
        if m.name == MANIFEST:
            manifests += 1
            if manifests > 1:
                raise refuse(arc, f"{MANIFEST!r} appears twice", m.name)
            continue
        if m.isdir() and unpack_dir_ok(m.name):
            continue
        if not unpack_path_ok(m.name):
            raise refuse(arc, f"unsafe member path {m.name!r:.200}", m.name)
        why = _not_a_file(m)
        if why is not None:
            raise refuse(arc, f"{m.name!r} {why}", m.name)
        if m.name in out:
            raise refuse(arc, f"{m.name!r} appears twice", m.name)
        want = files.get(m.name)
        if want is None:
            raise refuse(arc, f"{m.name!r} is not in the manifest", m.name)
        if want["size"] != m.size:
            raise refuse(
                arc, f"{m.name!r} is {m.size} bytes, the manifest says {want['size']}", m.name
            )
        out[m.name] = m
    missing = sorted(set(files) - set(out))
    if missing:
        raise refuse(
            arc, f"{len(missing)} manifest files are missing, e.g. {missing[0]!r}", missing[0]
        )
    return list(out.values())


def _disk_full(e: OSError, root: Path, arc: Path, member: str | None) -> CacheError:
    what = f"unpacking {member!r} from {arc}" if member else f"unpacking {arc}"
    return CacheError(
        e.errno,
        f"{root}: {os.strerror(e.errno or errno.ENOSPC)} while {what}; nothing was written",
        str(root),
    )


def _check_space(root: Path, arc: Path, sizes: Iterable[int]) -> None:
    """Refuse up front if the files cannot fit on the file system of
    ``root`` (when it reports its size); a disk filled meanwhile is still
    caught while writing."""
    probe = root
    while lstat(probe) is None and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return
    if st.f_blocks == 0 or st.f_frsize == 0:
        return
    need = sum(-(-size // st.f_frsize) * st.f_frsize for size in sizes)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise CacheError(
            errno.ENOSPC,
            f"{root}: {arc} unpacks to {need} bytes, only {free} are free there; "
            "nothing was written",
            str(root),
        )


def _copy_member(
    tar: tarfile.TarFile, arc: Path, m: tarfile.TarInfo, tmp: Path, want: int, budget: int
) -> int:
    """Stream ``m`` into the new file ``tmp``, at most ``want`` bytes (its
    manifest size) and ``budget`` (what is left of the manifest's total);
    the bytes written."""
    try:
        src = tar.extractfile(m)
        if src is None:
            raise refuse(arc, f"cannot read {m.name!r}", m.name)
        n = 0
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        with src, os.fdopen(fd, "wb") as dst:
            while chunk := src.read(CHUNK):
                n += len(chunk)
                if n > min(want, budget):
                    raise refuse(
                        arc,
                        f"{m.name!r} holds more than the {min(want, budget)} bytes its "
                        "manifest entry allows",
                        m.name,
                    )
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
    except _UNREADABLE as e:
        raise refuse(arc, f"cannot read {m.name!r} ({_why(e)})", m.name) from None
    if n != want:
        raise refuse(arc, f"{m.name!r} holds {n} bytes, the manifest says {want}", m.name)
    return n


def _stage(
    tar: tarfile.TarFile,
    arc: Path,
    members: Sequence[tarfile.TarInfo],
    staging: Path,
    files: dict[str, dict[str, Any]],
) -> list[tuple[str, Path]]:
    """Stream every member into ``staging`` within the manifest's sizes,
    then check it against the manifest's BLAKE3."""
    budget = sum(int(files[m.name]["size"]) for m in members)
    staged: list[tuple[str, Path]] = []
    for i, m in enumerate(members):
        tmp = staging / f"{i:08d}"
        try:
            budget -= _copy_member(tar, arc, m, tmp, int(files[m.name]["size"]), budget)
        except OSError as e:
            if e.errno in _DISK_FULL and not isinstance(e, CacheError):
                raise _disk_full(e, staging.parent, arc, m.name) from None
            raise
        staged.append((m.name, tmp))
    got = {f.path: f for f in hash_files_report([str(t) for _, t in staged]).files}
    for name, tmp in staged:
        f = got.get(str(tmp))
        if f is None or f.digest != files[name]["blake3"] or f.size != files[name]["size"]:
            raise refuse(arc, f"{name!r} does not match its checksum in the manifest", name)
    return staged


def _check_signers(
    arc: Path, staged: Sequence[tuple[str, Path]], trusted: TrustedKeys
) -> dict[PublicKey, int]:
    """Every artifact staged is a ``v3`` file, bound to the digest of its
    path, whose signature verifies and whose signer ``trusted`` trusts
    (else the archive is refused, naming the member and the signer); the
    signers and how many artifacts each signed."""
    signers: dict[PublicKey, int] = {}
    for name, tmp in staged:
        if not name.startswith("artifacts/"):
            continue
        try:
            art = read_artifact(tmp, CacheLayout.digest_of_artifact(name))
            check_artifact_signer(art, trusted, name)
        except CacheError as e:
            why = (e.strerror or str(e)).removeprefix(f"{tmp}: ").removeprefix(f"{name}: ")
            hint = ""
            signer = getattr(e, "signer", None)
            if signer is not None and "revoked" not in why:
                hint = f" (to accept it: `fxpiece cache unpack --trust {signer} ...`)"
            raise refuse(arc, f"{name!r}: {why}{hint}", name) from None
        if art.signer is not None:  # always: unsigned ones were refused
            signers[art.signer] = signers.get(art.signer, 0) + 1
    return signers


def _current_digests(root: Path, names: Sequence[str]) -> dict[str, str | None]:
    present = []
    for n in names:
        st = lstat(root / n)
        if st is not None and stat.S_ISREG(st.st_mode):
            present.append(n)
    if not present:
        return {}
    by_path = {f.path: f.digest for f in hash_files_report([str(root / n) for n in present]).files}
    return {n: by_path.get(str(root / n)) for n in present}


def _missing_folders(root: Path) -> list[Path]:
    """``root`` and its ancestors that do not exist yet, deepest first."""
    out = []
    p = root
    while lstat(p) is None and p != p.parent:
        out.append(p)
        p = p.parent
    return out


def _unpack(
    tar: tarfile.TarFile, arc: Path, root_p: Path, trusted: TrustedKeys
) -> tuple[UnpackResult, dict[PublicKey, int]]:
    files = read_manifest(tar, arc)
    members = _check_members(tar, arc, files)
    _check_space(root_p, arc, (int(files[m.name]["size"]) for m in members))
    made = _missing_folders(root_p)
    done = False
    try:
        root_p.mkdir(mode=0o700, parents=True, exist_ok=True)
        if root_p.is_symlink():
            root_p = root_p.resolve()
        staging = root_p / f".unpack-{os.getpid()}-{secrets.token_hex(6)}"
        os.mkdir(staging, 0o700)
        try:
            staged = _stage(tar, arc, members, staging, files)
            signers = _check_signers(arc, staged, trusted)
            current = _current_digests(root_p, [n for n, _ in staged])
            todo = [(n, t) for n, t in staged if current.get(n) != files[n]["blake3"]]
            move_all(root_p, todo, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        done = True
    except OSError as e:
        if e.errno in _DISK_FULL and not isinstance(e, CacheError):
            raise _disk_full(e, root_p, arc, None) from None
        raise
    finally:
        if not done:
            for d in made:  # the root and parents this call created, if still empty
                with contextlib.suppress(OSError):
                    os.rmdir(d)
    return UnpackResult(
        root=root_p,
        written=len(todo),
        unchanged=len(staged) - len(todo),
        bytes=sum(int(files[m.name]["size"]) for m in members),
    ), signers


def unpack_cache(
    archive: str | os.PathLike[str],
    root: str | os.PathLike[str],
    *,
    extra_trust: Iterable[PublicKey] = (),
    trusted: TrustedKeys | None = None,
) -> UnpackResult:
    """Unpack an archive made by :func:`pack_cache` into the cache ``root``.

    Every member header is checked before anything is written: it must be a
    regular file (no hard or symbolic links, devices, FIFOs or sparse files
    of any tar sparse format) with a safe relative path under
    ``artifacts/`` or ``models/`` (no absolute paths, no ``..``), listed in
    the manifest with the same size; the archive may hold no more members
    than the manifest's files and their folders, and the manifest's total
    must fit in the free space of ``root``'s file system. A refused archive
    raises :class:`ArchiveError` naming the archive and the member
    (``.member``). The files are then streamed, never more bytes than the
    manifest says, into a private staging folder inside ``root`` and their
    BLAKE3 checked against the manifest; only if all match, and every
    destination can take its file (no folder, symlink or device in the
    way), are they renamed into place; a failure midway puts back what was
    moved. A full disk raises :class:`CacheError` naming ``root``. On any
    failure the staging folder, and the folders this call created for
    ``root``, are removed. No half-written file is ever visible. Folders
    are created 0700, files 0600.

    Every artifact must be signed (``v3``) by a key of ``trusted`` (default
    :func:`~fxpiece.signing.trusted_keys`) or of ``extra_trust`` (``--trust
    KEY``: for this unpack only; a revoked key stays refused), checked after
    the manifest checksums and before anything is moved into place;
    otherwise :class:`ArchiveError` naming the member and its signer.
    """
    arc = Path(archive)
    if not arc.is_file():
        raise CacheError(errno.ENOENT, f"no archive at {arc}", str(arc))
    base = trusted_keys() if trusted is None else trusted
    extra = frozenset(extra_trust)
    try:
        with tarfile.open(arc, mode="r:*", tarinfo=ArchiveTarInfo) as tar:
            res, signers = _unpack(tar, arc, Path(root), base.with_keys(extra))
    except UnsafeHeader as e:
        raise refuse(arc, e.why, e.member) from None
    except _UNREADABLE as e:
        raise refuse(arc, f"not a readable tar archive ({_why(e)})") from None
    return UnpackResult(
        res.root,
        res.written,
        res.unchanged,
        res.bytes,
        tuple(sorted(signers.items())),
        tuple(sorted(k for k in signers if not base.trusts(k))),
    )
