"""Every file under an index folder is verified or refused: FIFOs, devices,
folders, symlinks (dangling, to a device, to a valid log outside) and
oversized files named like index files are reported, moved aside, never read,
never block, and never make the index unusable. Each scenario runs in a child
with a hard timeout, so a hang fails the test instead of blocking it."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from fxpiece import CacheError, CacheIndex, verify_index

K_GOOD = [(1, 8, 0, "inductor"), (9, 16, 0, "inductor")]
K_OUT = (66, 66, 0, "outside")
HOSTILE = {
    "fifo": "log-00000000000000000001-evil-1-0.json",
    "to_dev_zero": "log-00000000000000000002-evil-1-0.json",
    "dangling": "log-00000000000000000003-evil-1-0.json",
    "folder": "log-00000000000000000004-evil-1-0.json",
    "sparse_8gib": "snap-00000000000000000005-evil-1-0.json",
    "to_valid_log_outside": "log-00000000000000000006-evil-1-0.json",
}


def _plant(path: pathlib.Path, outside: pathlib.Path) -> None:
    os.mkfifo(path / HOSTILE["fifo"])
    (path / HOSTILE["to_dev_zero"]).symlink_to("/dev/zero")
    (path / HOSTILE["dangling"]).symlink_to(path / "nowhere")
    (path / HOSTILE["folder"]).mkdir()
    with open(path / HOSTILE["sparse_8gib"], "wb") as f:
        f.truncate(8 << 30)
    out = CacheIndex(outside)
    out.insert(K_OUT, "leaked")
    (log,) = [n for n in os.listdir(outside) if n.startswith("log-")]
    (path / HOSTILE["to_valid_log_outside"]).symlink_to(outside / log)


def _run(code: str, *args: object, timeout: float = 60) -> dict[str, object]:
    prelude = "import json, os, sys, warnings\nfrom fxpiece import _native as native\n"
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,  # a blocking open fails here rather than hanging
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


_OPEN = """
path, readonly = sys.argv[1], sys.argv[2] == "1"
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    idx = native.CacheIndex(path, readonly=readonly)
    n_open = len(w)
    idx.refresh()
    res = {
        "warnings": [str(x.message) for x in w],
        "categories": sorted({x.category.__name__ for x in w}),
        "warnings_after_refresh": len(w) - n_open,
        "keys": sorted(idx.keys()),
        "values": [idx.get(k) for k in sorted(idx.keys())],
        "listing": sorted(os.listdir(path)),
    }
print(json.dumps(res))
"""


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "readonly"])
def test_hostile_files_are_refused_and_the_index_works(
    tmp_path: pathlib.Path, readonly: bool
) -> None:
    path = tmp_path / "index"
    idx = CacheIndex(path)
    idx.insert(K_GOOD[0], "a/1")
    idx.insert(K_GOOD[1], "a/2")
    outside = tmp_path / "outside"
    _plant(path, outside)
    res = _run(_OPEN, path, int(readonly))
    assert [tuple(k) for k in res["keys"]] == K_GOOD  # type: ignore[union-attr]
    assert res["values"] == ["a/1", "a/2"]
    assert res["categories"] == ["CacheWarning"]
    warnings_ = res["warnings"]
    assert isinstance(warnings_, list) and len(warnings_) == len(HOSTILE), warnings_
    for name in HOSTILE.values():
        (msg,) = [m for m in warnings_ if f"/{name} " in m]
        assert "refused unread" in msg, msg
        if readonly:
            assert "could not be moved aside" in msg
        else:
            assert "moved aside to" in msg
    assert res["warnings_after_refresh"] == 0, "each bad file is reported once"
    listing = res["listing"]
    assert isinstance(listing, list)
    for name in HOSTILE.values():
        if readonly:
            assert name in listing
        else:
            assert name not in listing
            assert any(n.startswith(name + ".corrupt-") for n in listing), listing
    # The file outside was neither read nor touched.
    assert CacheIndex(outside).get(K_OUT) == "leaked"
    if not readonly:
        # Writable: the index keeps working and verifies clean.
        idx2 = CacheIndex(path)
        idx2.insert((17, 32, 0, "inductor"), "a/3")
        assert idx2.compact(timeout=10) is True
        assert len(CacheIndex(path)) == 3
        assert verify_index(path).ok


_VERIFY = """
path = sys.argv[1]
good, problems = native.verify_index(path)
res = {"good": good, "problems": problems}
errs = {}
for name in os.listdir(path):
    if name.startswith(("log-", "snap-")):
        try:
            native.verify_index_file(os.path.join(path, name))
            errs[name] = None
        except __import__("fxpiece.errors").errors.CacheError as e:
            errs[name] = [type(e).__name__, e.errno, e.filename]
res["files"] = errs
good2, repaired = native.verify_index(path, repair=True)
res["repaired"] = repaired
res["after"] = native.verify_index(path)
print(json.dumps(res))
"""


def test_verify_uses_the_same_safe_reader(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    CacheIndex(path).insert(K_GOOD[0], "a/1")
    _plant(path, tmp_path / "outside")
    res = _run(_VERIFY, path)
    assert res["good"] == 1
    problems = res["problems"]
    assert isinstance(problems, list) and len(problems) == len(HOSTILE)
    assert all(moved is None for _, _, moved in problems)
    files = res["files"]
    assert isinstance(files, dict)
    expect = {
        "fifo": errno.ENXIO,
        "to_dev_zero": errno.ELOOP,
        "dangling": errno.ELOOP,
        "folder": errno.EISDIR,
        "sparse_8gib": errno.EFBIG,
        "to_valid_log_outside": errno.ELOOP,
    }
    for what, name in HOSTILE.items():
        kind, err, filename = files[name]
        assert kind == "CacheError" and err == expect[what], (what, files[name])
        assert filename == str(path / name)
    repaired = res["repaired"]
    assert isinstance(repaired, list) and all(moved for _, _, moved in repaired)
    assert res["after"] == [1, []]


def test_a_symlinked_index_folder_is_refused(tmp_path: pathlib.Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "index"
    link.symlink_to(real)
    for make in (lambda: CacheIndex(link), lambda: verify_index(link)):
        with pytest.raises(CacheError) as ei:
            make()
        assert ei.value.errno == errno.ELOOP
        assert ei.value.filename == str(link)
        assert "symbolic link" in str(ei.value)
    dangling = tmp_path / "index2"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(CacheError):
        CacheIndex(dangling)
    assert not (tmp_path / "nowhere").exists()


def test_a_hostile_lock_file_is_moved_aside(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    idx = CacheIndex(path)
    idx.insert(K_GOOD[0], "a/1")
    outside = tmp_path / "lock-target"
    (path / "LOCK").unlink(missing_ok=True)
    (path / "LOCK").symlink_to(outside)
    res = _run(
        """
        path = sys.argv[1]
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            idx = native.CacheIndex(path)
            ok = idx.compact(timeout=10)
        print(json.dumps({"ok": ok, "w": [str(x.message) for x in w]}))
        """,
        path,
    )
    assert res["ok"] is True
    assert not outside.exists(), "the symlink was not followed"
    assert any("LOCK" in m for m in res["w"]), res  # type: ignore[union-attr]
    assert (path / "LOCK").is_file() and not (path / "LOCK").is_symlink()
