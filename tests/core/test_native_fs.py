"""The file-system and process helpers of fxpiece._native: quarantine,
pid_alive, this_host, read_regular_file (one implementation, shared by the
index and the Python side)."""

from __future__ import annotations

import errno
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from fxpiece import _native as native
from fxpiece.errors import CacheError


def test_quarantine_never_overwrites_an_earlier_copy(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "artifact.bin"
    asides = []
    t0 = time.time()
    for i in range(5):  # well within one second: the names must still differ
        p.write_bytes(b"copy %d" % i)
        aside = native.quarantine(p)
        assert isinstance(aside, str)
        assert not p.exists()
        asides.append(aside)
    assert time.time() - t0 < 5
    assert len(set(asides)) == 5
    for i, a in enumerate(asides):
        assert re.fullmatch(re.escape(str(p)) + r"\.corrupt-\d+(\.\d+)?", a), a
        assert pathlib.Path(a).read_bytes() == b"copy %d" % i
    # A copy that already has the name the next one would get is kept too.
    secs = int(time.time())
    for n in ["", *(f".{k}" for k in range(1, 4))]:
        (tmp_path / f"other.corrupt-{secs}{n}").write_bytes(b"older")
    (tmp_path / "other").write_bytes(b"newer")
    aside = native.quarantine(str(tmp_path / "other"))
    assert aside is not None and pathlib.Path(aside).read_bytes() == b"newer"
    for n in ["", *(f".{k}" for k in range(1, 4))]:
        assert (tmp_path / f"other.corrupt-{secs}{n}").read_bytes() == b"older"


def test_quarantine_moves_the_entry_not_its_target(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"t")
    link = tmp_path / "link"
    link.symlink_to(target)
    aside = native.quarantine(link)
    assert aside is not None and os.path.islink(aside)
    assert target.read_bytes() == b"t"
    d = tmp_path / "folder"
    d.mkdir()
    (d / "x").write_bytes(b"x")
    aside = native.quarantine(d)
    assert aside is not None and os.path.isdir(aside)
    os.mkfifo(tmp_path / "fifo")
    assert native.quarantine(tmp_path / "fifo") is not None


def test_quarantine_returns_none_when_it_cannot_move(tmp_path: pathlib.Path) -> None:
    assert native.quarantine(tmp_path / "missing") is None
    assert native.quarantine("/proc/self/status") is None


@pytest.mark.parametrize(
    "pid", [0, -1, -(2**31), 2**31, 2**63, -(2**63) - 1, 10**30, -(10**30), 4_999_999]
)
def test_pid_alive_never_raises_on_absurd_values(pid: int) -> None:
    assert native.pid_alive(pid) is False


def test_pid_alive_sees_live_and_dead_processes() -> None:
    assert native.pid_alive(os.getpid()) is True
    assert native.pid_alive(1) is True  # init: alive even if we may not signal it
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert native.pid_alive(p.pid) is False
    assert native.pid_alive(True) is True  # an int subclass; pid 1
    with pytest.raises(TypeError):
        native.pid_alive("1")  # type: ignore[arg-type]


def test_this_host_is_file_name_safe() -> None:
    h = native.this_host()
    assert isinstance(h, str) and h
    assert re.fullmatch(r"[A-Za-z0-9._]+", h), h


def _errno_of(path: object, max_bytes: int = 1 << 20) -> int:
    with pytest.raises(CacheError) as ei:
        native.read_regular_file(path, max_bytes)  # type: ignore[arg-type]
    assert ei.value.filename == str(path)
    assert isinstance(ei.value, OSError)
    return ei.value.errno


def test_read_regular_file_reads_regular_files_only(tmp_path: pathlib.Path) -> None:
    good = tmp_path / "good"
    good.write_bytes(b"hello\x00world")
    assert native.read_regular_file(good, 11) == b"hello\x00world"
    assert native.read_regular_file(str(good), 1 << 30) == b"hello\x00world"
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "link").symlink_to(good)
    (tmp_path / "dir").mkdir()
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(8 << 30)
    t0 = time.monotonic()
    assert _errno_of(tmp_path / "fifo") == errno.ENXIO
    assert _errno_of(tmp_path / "zero") == errno.ELOOP
    assert _errno_of(tmp_path / "dangling") == errno.ELOOP
    assert _errno_of(tmp_path / "link") == errno.ELOOP
    assert _errno_of(tmp_path / "dir") == errno.EISDIR
    assert _errno_of(tmp_path / "sparse", 256 << 20) == errno.EFBIG
    assert _errno_of(good, 10) == errno.EFBIG
    assert _errno_of(tmp_path / "missing") == errno.ENOENT
    assert time.monotonic() - t0 < 5, "nothing blocks"
    with pytest.raises(ValueError):
        native.read_regular_file(good, -1)


def test_read_regular_file_does_not_block_on_a_fifo_with_a_writer_waiting(
    tmp_path: pathlib.Path,
) -> None:
    # In a child with a hard timeout: a blocking open would hang, not fail.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = (
        "import errno, sys\n"
        "from fxpiece import _native as n\n"
        "try:\n"
        "    n.read_regular_file(sys.argv[1], 1024)\n"
        "except __import__('fxpiece.errors').errors.CacheError as e:\n"
        "    print(e.errno == errno.ENXIO)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == "True", proc.stderr


def test_sync_files_syncs_regular_files_and_never_opens_anything_else(
    tmp_path: pathlib.Path,
) -> None:
    # A FIFO (its open would block), a symlink out of the folder (never
    # followed), a folder and a file gone since: each named, none fatal.
    good = tmp_path / "good"
    good.write_bytes(b"pulled bytes")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.write_bytes(b"not ours")
    link = tmp_path / "link"
    link.symlink_to(outside)
    t0 = time.monotonic()
    failed = native.sync_files([good, fifo, link, tmp_path, tmp_path / "gone"])
    assert time.monotonic() - t0 < 5, "nothing blocks"
    assert [f.split(": ", 1)[0] for f in failed] == [str(fifo), str(link), str(tmp_path)]
    assert "FIFO" in failed[0] and "folder" in failed[2], failed
    assert good.read_bytes() == b"pulled bytes"
    assert native.sync_files([]) == []
