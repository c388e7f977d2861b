"""Kernel bundles (fxpiece.piecewise.kernels): a malformed bundle is refused
whole with CorruptArtifactError and leaves nothing in the KernelDir; a write
that fails midway is a CacheError and leaves nothing either; valid bundles
round-trip and files already there are kept."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from fxpiece.errors import CacheError, CorruptArtifactError
from fxpiece.piecewise import kernels
from fxpiece.piecewise.kernels import KernelDir

MAGIC = b"FXPIECE-KERNELS v1\n"


def payload(*members: tuple[str, bytes]) -> bytes:
    """A bundle payload listing ``members`` as given (however malformed)."""
    manifest = json.dumps([[rel, len(data)] for rel, data in members]).encode()
    return b"".join([MAGIC, manifest, b"\n", *(data for _, data in members)])


def listing(root: Path) -> dict[str, bytes | None]:
    """Every folder (``None``) and file (its bytes) under ``root``, hidden ones too."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            full = os.path.join(dirpath, f)
            out[os.path.relpath(full, root)] = Path(full).read_bytes()
    return out


@pytest.fixture
def kd() -> KernelDir:
    """A KernelDir that already holds a file, and a folder with a file in it."""
    k = KernelDir()
    (k.path / "ab").mkdir()
    (k.path / "ab" / "k.so").write_bytes(b"old kernel")
    (k.path / "d").mkdir()
    (k.path / "d" / "x.py").write_bytes(b"x = 1\n")
    return k


LONG = "n" * 300
DEEP = "/".join(["p" * 250] * 20)  # every name fits NAME_MAX, the path is over PATH_MAX

MALFORMED = {
    "file then folder of that name": [("a", b"1"), ("a/b", b"2")],
    "folder then file of that name": [("a/b", b"2"), ("a", b"1")],
    "deeper file under a file": [("q/a", b"1"), ("q/a/b/c", b"2")],
    "300-char name": [("fine.so", b"ok"), (LONG, b"x")],
    "300-char folder name": [("fine.so", b"ok"), (f"{LONG}/k.so", b"x")],
    "path over PATH_MAX": [("fine.so", b"ok"), (DEEP, b"x")],
    "duplicate": [("dup.so", b"1"), ("dup.so", b"2")],
    "name of an existing folder": [("fine.so", b"ok"), ("d", b"file where a folder is")],
    "under an existing file": [("fine.so", b"ok"), ("ab/k.so/inner", b"x")],
    "under a skipped folder": [("fine.so", b"ok"), ("fxgraph/x", b"x")],
    "parent escape": [("fine.so", b"ok"), ("../escape", b"x")],
    "absolute": [("fine.so", b"ok"), ("/tmp/abs", b"x")],
    "hidden": [("fine.so", b"ok"), ("z/.hidden", b"x")],
    "not normalized": [("fine.so", b"ok"), ("z/./y", b"x")],
    "lone surrogate": [("fine.so", b"ok"), ("z\ud800", b"x")],
}


@pytest.mark.parametrize("members", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_bundle_is_refused_and_writes_nothing(
    kd: KernelDir, members: list[tuple[str, bytes]]
) -> None:
    before = listing(kd.path)
    with pytest.raises(CorruptArtifactError, match="kernel bundle"):
        kd.unpack(payload(*members))
    assert listing(kd.path) == before
    # Nothing of it counts as unpacked: a later valid bundle brings the files.
    assert kd.unpack(payload(("fine.so", b"ok"))) == 1


def test_symlink_in_a_members_place_is_refused(kd: KernelDir) -> None:
    os.symlink("/etc/passwd", kd.path / "link.so")
    os.symlink("/etc", kd.path / "linkdir")
    before = listing(kd.path)
    for members in ([("link.so", b"x")], [("linkdir/passwd", b"x")]):
        with pytest.raises(CorruptArtifactError, match="symlink"):
            kd.unpack(payload(("fine.so", b"ok"), *members))
        assert listing(kd.path) == before


@pytest.mark.parametrize(
    "bad",
    [
        b"not a bundle",
        MAGIC + b"[]",  # no newline after the manifest
        MAGIC + b"{\n",
        MAGIC + b'[["a", 2]]\nabc',  # sizes do not add up
        MAGIC + b'[["a", -1]]\n',
        MAGIC + b'[["a", true]]\n',
        MAGIC + b'[["a"]]\n',
        MAGIC + b'{"a": 1}\n',
        MAGIC + b"[" * 100_000 + b"\n",
    ],
)
def test_bad_header_or_manifest(kd: KernelDir, bad: bytes) -> None:
    before = listing(kd.path)
    with pytest.raises(CorruptArtifactError):
        kd.unpack(bad)
    assert listing(kd.path) == before


def test_member_names_are_shown_short(kd: KernelDir) -> None:
    with pytest.raises(CorruptArtifactError) as e:
        kd.unpack(payload((LONG, b"x")))
    assert "over 255 bytes" in str(e.value)
    assert len(str(e.value)) < 200


def test_valid_bundle_round_trips() -> None:
    src = KernelDir()
    files = {
        "ab/k.so": b"\x7fELF kernel",
        "ab/cd/deep.py": b"def f(): pass\n",
        "empty.txt": b"",
        "x/y/z/w.bin": os.urandom(70_000),
    }
    for rel, data in files.items():
        (src.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (src.path / rel).write_bytes(data)
    data = src.bundle()
    assert isinstance(data, bytes)  # what the store checksums
    # The format: magic line, manifest of [path, size], the bytes in that order.
    manifest = json.loads(data[len(MAGIC) : data.index(b"\n", len(MAGIC))])
    assert sorted(rel for rel, _ in manifest) == sorted(files)
    assert data == payload(*((rel, files[rel]) for rel, _ in manifest))

    dst = KernelDir()
    assert dst.unpack(data) == len(files)
    got = {rel: content for rel, content in listing(dst.path).items() if content is not None}
    assert got == files
    for rel in listing(dst.path):
        mode = os.lstat(dst.path / rel).st_mode
        assert stat.S_IMODE(mode) & 0o077 == 0, rel  # private, folders and files
    assert dst.bundle() is None  # nothing new since the unpack
    # No temporary folder stays behind.
    assert not [p for p in dst.path.iterdir() if p.name.startswith(".")]
    # The payload may be any bytes-like object (e.g. a view of a larger buffer).
    again = KernelDir()
    assert again.unpack(memoryview(bytearray(data))) == len(files)
    assert again.files().keys() == files.keys()


def test_files_already_here_are_kept(kd: KernelDir) -> None:
    data = payload(("ab/k.so", b"new kernel"), ("ab/new.so", b"fresh"), ("d/x.py", b"x = 2\n"))
    assert kd.unpack(data) == 1
    assert (kd.path / "ab" / "k.so").read_bytes() == b"old kernel"
    assert (kd.path / "d" / "x.py").read_bytes() == b"x = 1\n"
    assert (kd.path / "ab" / "new.so").read_bytes() == b"fresh"
    assert kd.unpack(data) == 0
    assert kd.bundle() is None  # every member counts as known


def test_delta_is_unpacked_and_kept_out_of_bundles() -> None:
    src, dst = KernelDir(), KernelDir()
    (src.path / "p.so").write_bytes(b"piece")
    delta = src.delta()
    assert delta is not None and src.bundle() is None
    assert dst.unpack(delta, delta=True) == 1
    (dst.path / "other.so").write_bytes(b"model")
    model = dst.bundle()
    assert model is not None
    assert json.loads(model[len(MAGIC) : model.index(b"\n", len(MAGIC))]) == [["other.so", 5]]


def test_write_failure_midway_leaves_nothing(
    kd: KernelDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No space left while writing the third file: a CacheError naming the
    member; the files written before it are gone, so is the temp folder."""
    before = listing(kd.path)
    real_write = os.write
    calls = []

    def write(fd: int, data: memoryview) -> int:
        calls.append(len(data))
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(kernels.os, "write", write)
    data = payload(("n1/a.so", b"1"), ("n1/b.so", b"2"), ("n2/c.so", b"3"))
    with pytest.raises(CacheError, match=r"n2/c\.so.*No space left") as e:
        kd.unpack(data)
    assert not isinstance(e.value, CorruptArtifactError)
    assert e.value.errno == errno.ENOSPC
    assert listing(kd.path) == before


def test_placing_failure_midway_removes_what_was_placed(
    kd: KernelDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while moving files into place (after some were) takes the
    placed files and the folders made for them back out."""
    before = listing(kd.path)
    real_link = os.link
    calls = []

    def link(src: str, dst: str, **kw: object) -> None:
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(errno.EIO, "Input/output error")
        real_link(src, dst, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(kernels.os, "link", link)
    data = payload(("n1/a.so", b"1"), ("n1/n2/b.so", b"2"), ("ab/c.so", b"3"))
    with pytest.raises(CacheError, match=r"ab/c\.so") as e:
        kd.unpack(data)
    assert e.value.errno == errno.EIO
    assert len(calls) == 3
    assert listing(kd.path) == before


def test_existing_file_name_failure_is_corrupt(
    kd: KernelDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError that says the name cannot be a file here (the file system
    refuses it) is a CorruptArtifactError, never a raw OSError."""
    real_open = os.open

    def open_(path: str, flags: int, mode: int = 0o777, **kw: int) -> int:
        if str(path).endswith("b.so"):
            raise OSError(errno.ENAMETOOLONG, "File name too long", str(path))
        return real_open(path, flags, mode, **kw)

    before = listing(kd.path)
    monkeypatch.setattr(kernels.os, "open", open_)
    with pytest.raises(CorruptArtifactError, match=r"b\.so"):
        kd.unpack(payload(("a.so", b"1"), ("b.so", b"2")))
    assert listing(kd.path) == before


def test_bundle_skips_a_file_removed_while_packing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = KernelDir()
    (src.path / "stays.so").write_bytes(b"stays")
    (src.path / "goes.so").write_bytes(b"goes")
    real_files = src.files

    def files() -> dict[str, Path]:
        out = real_files()
        (src.path / "goes.so").unlink()
        return out

    monkeypatch.setattr(src, "files", files)
    data = src.bundle()
    assert data == payload(("stays.so", b"stays"))
