"""``cache unpack`` is bounded: member headers and count are checked
against the manifest before a byte is written, sparse members (every tar
sparse format), links, devices and FIFOs are refused, members are streamed
within the manifest's sizes, and a full disk is a clean :class:`CacheError`
naming the path, with nothing left behind.

The archives are real tars built here with :mod:`tarfile` and :mod:`gzip`
(the sparse headers are patched in by hand: :mod:`tarfile` reads them but
does not write them). The tests that need a small disk mount a tmpfs (root
only); they are skipped otherwise.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from fxpiece.cache.admin import ArchiveError, pack_cache, unpack_cache
from fxpiece.cache.store import encode_artifact
from fxpiece.errors import CacheError
from fxpiece.signing import builder_key

GIB = 1 << 30
MIB = 1 << 20
NAME = "artifacts/aa/x"


# -- building archives -----------------------------------------------------------------


def manifest(files: dict[str, int]) -> bytes:
    entries = [{"path": p, "size": n, "blake3": "0" * 64} for p, n in files.items()]
    return json.dumps({"format": "fxpiece-cache", "version": 1, "files": entries}).encode()


def block(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)


def reg(name: str, data: bytes) -> bytes:
    """A regular member, header and data blocks."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o600
    return info.tobuf(format=tarfile.GNU_FORMAT) + block(data)


def old_gnu_sparse(name: str, realsize: int, data: bytes) -> bytes:
    """An old GNU sparse (type ``S``) member: ``data`` stored, declared as
    the last bytes of a ``realsize`` file whose start is a hole."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.type = len(data), 0o600, tarfile.GNUTYPE_SPARSE
    buf = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    buf[386:398] = tarfile.itn(realsize - len(data), 12, tarfile.GNU_FORMAT)  # offset
    buf[398:410] = tarfile.itn(len(data), 12, tarfile.GNU_FORMAT)  # numbytes
    buf[482] = 0  # no extension blocks
    buf[483:495] = tarfile.itn(realsize, 12, tarfile.GNU_FORMAT)  # real size
    buf[148:156] = b" " * 8
    buf[148:155] = b"%06o\0" % sum(buf)
    return bytes(buf) + block(data)


def pax_sparse(version: str, name: str, realsize: int, data: bytes) -> bytes:
    """A member in one of GNU tar's PAX sparse formats (0.0, 0.1, 1.0)."""
    hole = realsize - len(data)
    info = tarfile.TarInfo(f"artifacts/aa/GNUSparseFile.0/{name.rsplit('/', 1)[1]}")
    info.mode = 0o600
    info.pax_headers = {"GNU.sparse.name": name}
    body = data
    if version == "0.0":
        info.pax_headers.update(
            {
                "GNU.sparse.size": str(realsize),
                "GNU.sparse.numblocks": "1",
                "GNU.sparse.offset": str(hole),
                "GNU.sparse.numbytes": str(len(data)),
            }
        )
    elif version == "0.1":
        info.pax_headers.update(
            {"GNU.sparse.size": str(realsize), "GNU.sparse.map": f"{hole},{len(data)}"}
        )
    else:
        info.pax_headers.update(
            {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": str(realsize)}
        )
        body = block(b"1\n%d\n%d\n" % (hole, len(data))) + data
    info.size = len(body)
    return info.tobuf(format=tarfile.PAX_FORMAT) + block(body)


def special(name: str, kind: bytes, linkname: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o600
    return info.tobuf(format=tarfile.GNU_FORMAT)


def folder(name: str) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o700
    return info.tobuf(format=tarfile.GNU_FORMAT)


def write_archive(path: Path, files: dict[str, int], *members: bytes | Iterable[bytes]) -> Path:
    """A tar led by a manifest listing ``files``, then ``members`` (their
    bytes, or chunks of them), written as they come; gzip if ``path`` ends
    in ``.gz``."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wb") as out:
        out.write(reg("manifest.json", manifest(files)))
        for m in members:
            for chunk in [m] if isinstance(m, bytes) else m:
                out.write(chunk)
        out.write(b"\0" * 1024)
    return path


def refused(archive: Path, root: Path, member: str) -> ArchiveError:
    """Unpack must refuse ``archive`` naming it and ``member``; nothing written."""
    with pytest.raises(ArchiveError) as e:
        unpack_cache(archive, root)
    assert e.value.member == member
    assert str(archive) in str(e.value) and repr(member) in str(e.value)
    assert "nothing was written" in str(e.value)
    assert not root.exists()
    return e.value


# -- a small real disk -------------------------------------------------------------------


@pytest.fixture
def small_disk() -> Iterator[Callable[..., Path]]:
    """Mount tmpfs file systems (``size``, optionally ``nr_inodes``); each is
    unmounted and removed afterwards, whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounts: list[Path] = []

    def mount(size: str = "32m", inodes: int | None = None) -> Path:
        where = Path(tempfile.mkdtemp(prefix="fxpiece-tmpfs-"))
        opts = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            where.rmdir()
            pytest.skip(f"cannot mount a tmpfs: {proc.stderr.strip() or proc.returncode}")
        mounts.append(where)
        return where

    try:
        yield mount
    finally:
        for where in mounts:
            subprocess.run(["umount", "-l", str(where)], check=False)
            with contextlib.suppress(OSError):
                where.rmdir()


def used(mount: Path) -> int:
    st = os.statvfs(mount)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def left_behind(mount: Path) -> list[str]:
    return [os.path.join(d, n) for d, dirs, files in os.walk(mount) for n in dirs + files]


# -- sparse members ------------------------------------------------------------------------


def test_old_gnu_sparse_bomb_is_refused_before_writing(
    tmp_path: Path, small_disk: Callable[..., Path]
) -> None:
    """12 KiB of tar declaring a 4 GiB file (the manifest agrees): refused
    at its header; not a byte reaches the 32 MiB disk."""
    disk = small_disk("32m")
    data = b"x" * 512
    arc = write_archive(
        tmp_path / "sparse.tar", {NAME: 4 * GIB}, old_gnu_sparse(NAME, 4 * GIB, data)
    )
    assert arc.stat().st_size < 12 * 1024
    with tarfile.open(arc) as tar:  # what the stdlib makes of it: a 4 GiB file
        (m,) = [m for m in tar.getmembers() if m.name == NAME]
        assert m.issparse() and m.size == 4 * GIB
    e = refused(arc, disk / "root", NAME)
    assert "sparse" in str(e)
    assert left_behind(disk) == [] and used(disk) == 0


@pytest.mark.parametrize("version", ["0.0", "0.1", "1.0"])
def test_pax_sparse_bomb_is_refused_before_writing(
    tmp_path: Path, small_disk: Callable[..., Path], version: str
) -> None:
    disk = small_disk("32m")
    arc = write_archive(
        tmp_path / "sparse.tar.gz",
        {NAME: 4 * GIB},
        pax_sparse(version, NAME, 4 * GIB, b"x" * 512),
    )
    with tarfile.open(arc) as tar:
        (m,) = [m for m in tar.getmembers() if m.name == NAME]
        assert m.issparse() and m.size == 4 * GIB
    e = refused(arc, disk / "root", NAME)
    assert "sparse" in str(e)
    assert left_behind(disk) == [] and used(disk) == 0


# -- gzip bombs on a small disk --------------------------------------------------------------


def zeros_member(name: str, size: int) -> Iterator[bytes]:
    """A regular member of ``size`` zero bytes (a multiple of 1 MiB), in chunks."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o600
    yield info.tobuf(format=tarfile.GNU_FORMAT)
    for _ in range(size // MIB):
        yield bytes(MIB)


def test_gzip_bomb_with_a_lying_manifest_is_refused_naming_the_member(
    tmp_path: Path, small_disk: Callable[..., Path]
) -> None:
    disk = small_disk("32m")
    big = "artifacts/bb/big"
    arc = write_archive(tmp_path / "bomb.tar.gz", {big: 1024}, zeros_member(big, 256 * MIB))
    assert arc.stat().st_size < MIB
    e = refused(arc, disk / "root", big)
    assert f"is {256 * MIB} bytes, the manifest says 1024" in str(e)
    assert left_behind(disk) == [] and used(disk) == 0


def test_gzip_bomb_with_an_honest_manifest_is_a_disk_full_error(
    tmp_path: Path, small_disk: Callable[..., Path]
) -> None:
    """~0.25 MB of .tar.gz unpacking to 256 MiB: a CacheError naming the
    destination, before anything is written; the disk stays empty."""
    disk = small_disk("32m")
    files = {f"artifacts/b{i}/big": 64 * MIB for i in range(4)}
    arc = write_archive(
        tmp_path / "bomb.tar.gz", files, *(zeros_member(n, s) for n, s in files.items())
    )
    assert arc.stat().st_size < MIB
    root = disk / "cache" / "root"
    with pytest.raises(CacheError) as e:
        unpack_cache(arc, root)
    assert not isinstance(e.value, ArchiveError)
    assert e.value.errno == 28 and e.value.filename == str(root)
    assert str(root) in str(e.value) and str(arc) in str(e.value)
    assert left_behind(disk) == [] and used(disk) == 0


def test_a_disk_filling_midway_is_a_clean_error_and_leaves_nothing(
    tmp_path: Path, small_disk: Callable[..., Path]
) -> None:
    """The bytes fit but the file system runs out of inodes while staging:
    ENOSPC from the kernel, mid-extraction. A CacheError naming the root and
    the member; the staging folder and the root this call made are gone,
    what was there before is untouched."""
    disk = small_disk("32m", inodes=16)
    (disk / "keep").write_bytes(b"mine")
    files = {f"artifacts/aa/f{i:03d}": 10 for i in range(40)}
    arc = write_archive(tmp_path / "many.tar", files, *(reg(n, b"0123456789") for n in files))
    root = disk / "new" / "root"
    with pytest.raises(CacheError) as e:
        unpack_cache(arc, root)
    assert not isinstance(e.value, ArchiveError)
    assert e.value.errno == 28 and e.value.filename == str(root)
    assert "No space left on device" in str(e.value) and "'artifacts/aa/f" in str(e.value)
    assert left_behind(disk) == [str(disk / "keep")]
    assert (disk / "keep").read_bytes() == b"mine"


def test_round_trip_fits_a_small_disk(tmp_path: Path, small_disk: Callable[..., Path]) -> None:
    disk = small_disk("8m")
    src = make_cache(tmp_path / "src", {f"artifacts/aa/f{i}": 1 * MIB for i in range(3)})
    arc = tmp_path / "c.tar.gz"
    pack_cache(src, arc)
    res = unpack_cache(arc, disk / "root")
    assert res.written == 3 and res.bytes == on_disk(src, (f"artifacts/aa/f{i}" for i in range(3)))
    assert sorted(left_behind(disk / "root")) == sorted(
        [str(disk / "root" / d) for d in ("artifacts", "artifacts/aa")]
        + [str(disk / "root" / f"artifacts/aa/f{i}") for i in range(3)]
    )


# -- members the manifest does not allow ------------------------------------------------------


def test_a_member_not_in_the_manifest_is_refused(tmp_path: Path) -> None:
    arc = write_archive(
        tmp_path / "a.tar", {NAME: 3}, reg(NAME, b"abc"), reg("artifacts/aa/extra", b"def")
    )
    refused(arc, tmp_path / "root", "artifacts/aa/extra")


def test_a_member_bigger_than_its_manifest_entry_is_refused(tmp_path: Path) -> None:
    arc = write_archive(tmp_path / "a.tar.gz", {NAME: 3}, reg(NAME, b"abc" * 1000))
    e = refused(arc, tmp_path / "root", NAME)
    assert "3000 bytes, the manifest says 3" in str(e)


@pytest.mark.parametrize(
    ("kind", "linkname", "why"),
    [
        (tarfile.LNKTYPE, "artifacts/aa/y", "hard link"),
        (tarfile.SYMTYPE, "/etc/passwd", "symbolic link"),
        (tarfile.CHRTYPE, "", "device"),
        (tarfile.BLKTYPE, "", "device"),
        (tarfile.FIFOTYPE, "", "FIFO"),
    ],
)
def test_links_devices_and_fifos_are_refused(
    tmp_path: Path, kind: bytes, linkname: str, why: str
) -> None:
    arc = write_archive(
        tmp_path / "a.tar",
        {"artifacts/aa/y": 3, NAME: 0},
        reg("artifacts/aa/y", b"abc"),
        special(NAME, kind, linkname),
    )
    e = refused(arc, tmp_path / "root", NAME)
    assert why in str(e)


def test_too_many_members_are_refused(tmp_path: Path) -> None:
    """One listed file and thousands of (harmless-looking) folder members:
    refused at the first member past what the manifest allows."""
    dirs = [folder(f"artifacts/d{i}") for i in range(5000)]
    arc = write_archive(
        tmp_path / "a.tar.gz", {NAME: 3}, folder("artifacts"), reg(NAME, b"abc"), *dirs
    )
    # manifest + file + its folders "artifacts" and "artifacts/aa": 4 members allowed
    e = refused(arc, tmp_path / "root", "artifacts/d1")
    assert "more than 4 members" in str(e)


def test_a_second_manifest_is_refused(tmp_path: Path) -> None:
    arc = write_archive(
        tmp_path / "a.tar", {NAME: 3}, reg(NAME, b"abc"), reg("manifest.json", manifest({}))
    )
    refused(arc, tmp_path / "root", "manifest.json")


# -- the normal case ------------------------------------------------------------------------


def make_cache(root: Path, files: dict[str, int]) -> Path:
    """Random files; those under artifacts/ are artifacts of a random
    ``size``-byte payload, signed by this (test session's) builder key:
    unpack accepts only those."""
    for rel, size in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        if rel.startswith("artifacts/"):
            data = encode_artifact(data, rel.rsplit("/", 1)[1], key=builder_key())
        (root / rel).write_bytes(data)
    return root


def on_disk(root: Path, files: Iterable[str]) -> int:
    return sum((root / rel).stat().st_size for rel in files)


def test_pack_unpack_round_trip(tmp_path: Path) -> None:
    files = {"artifacts/ab/ab01": 5000, "artifacts/cd/cd02": 0, "models/m/index/x": 70_000}
    src = make_cache(tmp_path / "src", files)
    for suffix in ("tar", "tar.gz", "tar.xz"):
        arc = tmp_path / f"c.{suffix}"
        pack_cache(src, arc)
        dst = tmp_path / f"dst-{suffix}"
        res = unpack_cache(arc, dst)
        assert (res.written, res.unchanged, res.bytes) == (3, 0, on_disk(src, files))
        for rel in files:
            assert (dst / rel).read_bytes() == (src / rel).read_bytes()
            assert (dst / rel).stat().st_mode & 0o777 == 0o600
        assert not [p for p in dst.iterdir() if p.name.startswith(".unpack-")]
        again = unpack_cache(arc, dst)
        assert (again.written, again.unchanged) == (0, 3)
