"""``fxpiece cache`` on hostile and broken input: no torch import, no hang,
no traceback, no partial write.

Each test builds a small cache without torch (the artifact store and the
index directly), so these run in seconds; ``tests/test_cli.py`` covers the
verbs on a cache made by a real compile.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fxpiece.cache.admin import ArchiveError, list_cache, pack_cache, unpack_cache
from fxpiece.cache.admin import place as place_module
from fxpiece.cache.index import CacheIndex
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.store import ArtifactStore
from fxpiece.cli import parse_age, parse_size

KEY = "ab" * 32
TIMEOUT = 60
# Runs the command line, then says on stderr whether torch got imported.
WRAPPER = """
import sys
from fxpiece.cli import main
code = main(sys.argv[1:])
print("TORCH-IMPORTED:", "torch" in sys.modules, file=sys.stderr)
raise SystemExit(code)
"""


def make_cache(root: Path, n: int = 4) -> list[Path]:
    """A cache with one model of ``n`` inductor entries; their artifact paths."""
    layout = CacheLayout(root)
    root.mkdir(mode=0o700, parents=True)
    store = ArtifactStore(layout)
    index = CacheIndex(str(layout.index_dir(layout.model_dir(KEY, "backbone"))))
    paths = []
    for i in range(n):
        digest = f"{i:02x}" * 32
        handle = store.put(digest, b"compiled piece %d " % i * 200)
        index.insert((1, 8, i, "inductor"), {"digest": digest, "handle": handle})
        paths.append(layout.artifact_path(digest))
    return paths


def snapshot(root: Path) -> dict[str, tuple[int, int, float, bytes | None]]:
    """Every path under ``root``: its type, and for files their inode, mtime
    and (regular files) content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            s = os.lstat(p)
            if stat.S_ISDIR(s.st_mode):
                out[str(p.relative_to(root))] = (stat.S_IFDIR, 0, 0.0, None)
                continue
            body = p.read_bytes() if stat.S_ISREG(s.st_mode) else None
            out[str(p.relative_to(root))] = (stat.S_IFMT(s.st_mode), s.st_ino, s.st_mtime, body)
    return out


def fx(*args: Any, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WRAPPER, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def one_line_error(proc: subprocess.CompletedProcess[str], rc: int) -> str:
    assert proc.returncode == rc, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("TORCH-IMPORTED:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# -- (a) torch is never imported ---------------------------------------------------


def test_cache_commands_never_import_torch(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    make_cache(root)
    env = {"FXPIECE_CACHE_ROOT": str(root)}
    for args, rc in (
        (["cache", "ls"], 0),
        (["cache", "verify"], 0),
        (["cache", "prune", "--dry-run", "--max-size", "1G"], 0),
    ):
        proc = fx(*args, env=env)
        assert proc.returncode == rc, (args, proc.stdout, proc.stderr)
        assert str(root) in proc.stdout  # the root came from FXPIECE_CACHE_ROOT
        assert "TORCH-IMPORTED: False" in proc.stderr, (args, proc.stderr)
    check = "import sys, fxpiece.cache, fxpiece.cache.admin; print('torch' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.stdout.strip() == "False", proc.stderr


# -- (b) hostile files: reported, never read, never blocking ----------------------


def test_ls_with_a_corrupt_index_file_lists_the_rest_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    make_cache(root)
    index = CacheLayout(root).index_dir(CacheLayout(root).model_dir(KEY, "backbone"))
    CacheIndex(str(index)).compact()  # the four entries into one snapshot
    CacheIndex(str(index)).insert((9, 64, 0, "inductor"), {"digest": "x", "handle": {}})
    (log,) = index.glob("log-*.json")
    log.write_bytes(b"garbage" + log.read_bytes()[7:])
    before = snapshot(root)
    listing = list_cache(root)
    (m,) = listing.models
    assert [e.piece for e in m.entries] == [0, 1, 2, 3]
    assert any("corrupt" in p or "magic" in p for p in m.problems), m.problems
    assert snapshot(root) == before


def test_verify_reports_hostile_files_without_hanging(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    fifo, link, folder, good = make_cache(root)
    layout = CacheLayout(root)
    for p in (fifo, link, folder):
        p.unlink()
    os.mkfifo(fifo)
    os.symlink("/dev/zero", link)
    folder.mkdir()
    index = layout.index_dir(layout.model_dir(KEY, "backbone"))
    index_fifo = index / "log-01796281224159493272-vm-1-aaaaaaaaaaaaaaaa.json"
    os.mkfifo(index_fifo)
    before = snapshot(root)

    proc = fx("cache", "verify", root)  # times out (TIMEOUT) if anything blocks
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    out = proc.stdout
    assert "FIFO" in out and "symlink" in out and "directory" in out and index_fifo.name in out
    report = json.loads(fx("cache", "verify", root, "--json").stdout)
    bad = [p["artifact"] for p in report["problems"]]
    assert sorted(bad) == sorted(str(p.relative_to(root)) for p in (fifo, link, folder))
    assert len(report["indexes"][0]["problems"]) == 1
    assert fx("cache", "ls", root).returncode == 0
    assert snapshot(root) == before  # nothing read, nothing moved

    proc = fx("cache", "verify", root, "--repair")
    assert proc.returncode == 1 and "4 problem(s) repaired" in proc.stdout, proc.stdout
    assert not any(os.path.lexists(p) for p in (fifo, link, folder, index_fifo))
    assert stat.S_ISFIFO(os.lstat(next(fifo.parent.glob("*.corrupt-*"))).st_mode)
    proc = fx("cache", "verify", root)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), proc.stdout
    assert good.exists()


# -- (c) pack never replaces what is not a regular file ----------------------------


@pytest.mark.parametrize("target", ["fifo", "/dev/full"])
def test_pack_refuses_a_non_regular_target(tmp_path: Path, target: str) -> None:
    root = tmp_path / "cache"
    make_cache(root)
    out = Path(target) if target.startswith("/") else tmp_path / target
    if target == "fifo":
        os.mkfifo(out)
    before = os.lstat(out)
    msg = one_line_error(fx("cache", "pack", root, "-o", out), 1)
    assert "not a regular file" in msg and "refusing" in msg
    after = os.lstat(out)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (
        before.st_mode,
        before.st_ino,
        before.st_rdev,
    )
    assert not [n for n in os.listdir(out.parent) if n.startswith(f".{out.name}.tmp")]


# -- (d) unpack moves everything or nothing ------------------------------------------


def _archive(tmp_path: Path) -> tuple[Path, list[str]]:
    src = tmp_path / "src"
    make_cache(src, n=3)
    archive = tmp_path / "cache.tar.gz"
    pack_cache(src, archive)
    with tarfile.open(archive) as tar:
        names = [n for n in tar.getnames() if n != "manifest.json"]
    return archive, names


def test_unpack_moves_nothing_if_a_destination_is_taken(tmp_path: Path) -> None:
    archive, names = _archive(tmp_path)
    root = tmp_path / "dst"
    (root / names[1]).mkdir(parents=True, mode=0o700)
    before = snapshot(root)
    msg = one_line_error(fx("cache", "unpack", archive, root), 1)
    assert names[1].split("/")[-1] in msg and "nothing was written" in msg
    assert snapshot(root) == before


def test_unpack_rolls_back_a_failure_midway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, names = _archive(tmp_path)
    root = tmp_path / "dst"
    (root / names[0]).parent.mkdir(parents=True, mode=0o700)
    (root / names[0]).write_bytes(b"an older version")
    before = snapshot(root)
    real = os.replace
    calls = []

    def flaky(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(dst))
        real(src, dst)

    monkeypatch.setattr(place_module.os, "replace", flaky)
    with pytest.raises(OSError, match="No space"):
        unpack_cache(archive, root)
    monkeypatch.undo()
    assert snapshot(root) == before
    assert unpack_cache(archive, root).written == len(names)


def test_bad_archives_are_one_line_errors(tmp_path: Path) -> None:
    deep = tmp_path / "deep.tar"
    body = b"[" * 100_000 + b"]" * 100_000
    with tarfile.open(deep, "w") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    with pytest.raises(ArchiveError, match="not JSON"):
        unpack_cache(deep, tmp_path / "r")
    junk = tmp_path / "junk.tar.xz"
    junk.write_bytes(b"\xfd7zXZ\x00\x00" + b"junk" * 100)
    for arc in (deep, junk):
        msg = one_line_error(fx("cache", "unpack", arc, tmp_path / "r"), 1)
        assert msg.startswith("fxpiece: error: refusing")
    assert not (tmp_path / "r").exists()


# -- input errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "option",
    [
        ["--max-size", "1" + "0" * 400],
        ["--max-size", "10X"],
        ["--max-size=-1G"],
        ["--older-than=-3d"],
        ["--older-than", "9" * 400 + "d"],
        ["--older-than", "infd"],
        ["--older-than", "nan"],
        [],
    ],
)
def test_bad_options_are_one_line_usage_errors(tmp_path: Path, option: list[str]) -> None:
    make_cache(tmp_path / "cache")
    msg = one_line_error(fx("cache", "prune", tmp_path / "cache", *option), 2)
    assert msg.startswith("fxpiece cache prune: error:")


sizes = st.one_of(
    st.text(),
    st.from_regex(r"\A\s*[0-9]{1,400}(\.[0-9]{1,30})?\s*[kmgtpKMGTP]?(i?[bB])?\s*\Z"),
)
ages = st.one_of(
    st.text(),
    st.from_regex(r"\A\s*([0-9]{1,400}(\.[0-9]{1,30})?[smhdwSMHDW]){1,4}\s*\Z"),
)


@settings(max_examples=400, deadline=None)
@given(sizes, ages)
def test_parse_size_and_age_return_finite_or_raise_value_error(size: str, age: str) -> None:
    for parse, text in ((parse_size, size), (parse_age, age)):
        try:
            value = parse(text)
        except ValueError:
            continue
        assert isinstance(value, (int, float)) and not isinstance(value, bool)
        assert math.isfinite(value) and value >= 0, (text, value)
