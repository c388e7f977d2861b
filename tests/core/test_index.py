"""The shared cache index (fxpiece.CacheIndex): API, reload, compaction, errors, corruption."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest
from programs.run import program_argv, program_env

import fxpiece
from fxpiece import (
    CacheError,
    CacheIndex,
    CacheWarning,
    CorruptIndexError,
    LockTimeoutError,
    verify_index,
    verify_index_file,
)
from fxpiece.cache.index import write_atomic

K1 = (1, 8, 0, "inductor")
K2 = (9, 32, 1, "inductor")
K3 = (33, 64, 2, "eager")


def _names(path: pathlib.Path, prefix: str = "") -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith(prefix))


def _logs(path: pathlib.Path) -> list[str]:
    return _names(path, "log-")


def _snaps(path: pathlib.Path) -> list[str]:
    return _names(path, "snap-")


def _temps(path: pathlib.Path) -> list[str]:
    return _names(path, ".tmp-")


class _NoWarnings:
    """Turn any warning (a CacheWarning above all) into an error."""

    def __enter__(self) -> None:
        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)


no_warnings = _NoWarnings


# ----- API ---------------------------------------------------------------------


def test_insert_get_contains_len(tmp_path: pathlib.Path) -> None:
    idx = CacheIndex(tmp_path / "index")
    assert len(idx) == 0
    assert idx.get(K1) is None
    assert idx.get(K1, "dflt") == "dflt"
    assert K1 not in idx
    idx.insert(K1, {"artifact": "artifacts/ab/abcd"})
    assert idx.get(K1) == {"artifact": "artifacts/ab/abcd"}
    assert K1 in idx
    assert len(idx) == 1
    assert (tmp_path / "index").is_dir()
    assert type(idx.path) is str and idx.path == str(tmp_path / "index")
    assert "entries=1" in repr(idx)


def test_reload_in_new_handle(tmp_path: pathlib.Path) -> None:
    a = CacheIndex(tmp_path / "index")
    a.insert(K1, "a/1")
    a.update({K2: "a/2", K3: None})
    with no_warnings():
        b = CacheIndex(str(tmp_path / "index"))
    assert len(b) == 3
    assert b.get(K1) == "a/1" and b.get(K2) == "a/2" and b.get(K3) is None
    assert K3 in b  # a stored None is an entry, not a miss


KEYS = [
    (0, 0, 0, ""),
    (-5, 2**63 - 1, -(2**63), "inductor"),
    (1, 2, 3, "ünïcödé ✓ 编译"),
    (1, 2, 3, 'with "quotes", \\ backslash,\nnewline, - dash, \x00 nul'),
    (2**62, -(2**62), 7, "eager"),
]


def test_keys_round_trip_exactly(tmp_path: pathlib.Path) -> None:
    idx = CacheIndex(tmp_path / "index")
    for i, k in enumerate(KEYS):
        idx.insert(k, i)
    for handle in (idx, CacheIndex(tmp_path / "index")):
        keys = handle.keys()
        assert sorted(keys) == sorted(KEYS)
        for k in keys:
            assert type(k) is tuple and len(k) == 4
            assert [type(x) for x in k] == [int, int, int, str]
        assert [handle.get(k) for k in KEYS] == list(range(len(KEYS)))
    # entries() is sorted by key and pairs each key with its value.
    entries = CacheIndex(tmp_path / "index").entries()
    assert [k for k, _ in entries] == sorted(KEYS)
    assert dict(entries) == {k: i for i, k in enumerate(KEYS)}


VALUES = [
    None,
    True,
    False,
    0,
    -(2**63),
    2**64 - 1,
    0.1,
    1e308,
    5e-324,
    -0.0,
    "",
    "text ✓\n\"'",
    [],
    {},
    [1, "two", 3.0, None, [True, {"x": []}]],
    {"artifact": "artifacts/ab/abcd", "size": 123, "meta": {"k": [1, 2]}},
]


def test_values_are_json_like_and_round_trip(tmp_path: pathlib.Path) -> None:
    idx = CacheIndex(tmp_path / "index")
    idx.update({(i, i, 0, "c"): v for i, v in enumerate(VALUES)})
    reloaded = CacheIndex(tmp_path / "index")
    for handle in (idx, reloaded):
        for i, v in enumerate(VALUES):
            got = handle.get((i, i, 0, "c"))
            assert got == v and type(got) is type(v), (i, v, got)
    # Tuples are stored as JSON arrays.
    idx.insert(K1, (1, (2, 3)))
    assert CacheIndex(tmp_path / "index").get(K1) == [1, [2, 3]]


@pytest.mark.parametrize(
    ("value", "exc", "match"),
    [
        (float("nan"), ValueError, "not finite"),
        ({"a": [1.0, float("inf")]}, ValueError, r"value\['a'\]\[1\]|value\[\"a\"\]\[1\]"),
        (2**64, ValueError, "64-bit"),
        ({1, 2}, TypeError, "set"),
        ({"a": object()}, TypeError, "object"),
        ({1: "x"}, TypeError, "keys must be str"),
        (b"bytes", TypeError, "bytes"),
    ],
)
def test_bad_values(tmp_path: pathlib.Path, value: object, exc: type, match: str) -> None:
    idx = CacheIndex(tmp_path / "index")
    with pytest.raises(exc, match=match):
        idx.insert(K1, value)
    assert len(idx) == 0
    assert _logs(tmp_path / "index") == []


def test_value_nesting_limit(tmp_path: pathlib.Path) -> None:
    idx = CacheIndex(tmp_path / "index")
    ok: object = "leaf"
    for _ in range(60):
        ok = [ok]
    idx.insert(K1, ok)
    assert CacheIndex(tmp_path / "index").get(K1) == ok
    deep: object = "leaf"
    for _ in range(100_000):
        deep = {"k": deep}
    with pytest.raises(ValueError, match="nested deeper"):
        idx.insert(K2, deep)
    assert K2 not in idx


@pytest.mark.parametrize(
    "key",
    [
        [1, 2, 3, "c"],
        (1, 2, 3),
        (1, 2, 3, "c", 4),
        ("1", 2, 3, "c"),
        (1.0, 2, 3, "c"),
        (True, 2, 3, "c"),
        (1, 2, 3, 4),
        (1, 2, 3, b"c"),
        (2**63, 2, 3, "c"),
        None,
        "1,2,3,c",
    ],
)
def test_bad_key_is_type_error(tmp_path: pathlib.Path, key: object) -> None:
    idx = CacheIndex(tmp_path / "index")
    with pytest.raises(TypeError, match="range_start"):
        idx.insert(key, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        idx.get(key)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _ = key in idx
    with pytest.raises(TypeError):
        idx.remove(key)  # type: ignore[arg-type]


def test_update_forms_and_atomicity(tmp_path: pathlib.Path) -> None:
    idx = CacheIndex(tmp_path / "index", compact_after=1000)
    idx.update({K1: 1})
    idx.update([(K2, 2)])
    idx.update((k, v) for k, v in [(K3, 3)])
    assert len(_logs(tmp_path / "index")) == 3
    idx.update({})  # nothing to commit: no file
    assert len(_logs(tmp_path / "index")) == 3
    # Many entries, one commit.
    idx.update({(i, i, 9, "batch"): i for i in range(50)})
    assert len(_logs(tmp_path / "index")) == 4
    # A bad key or value anywhere: nothing of the batch is committed.
    with pytest.raises(TypeError):
        idx.update({(100, 100, 0, "ok"): 1, (1, 2): 2})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        idx.update({(101, 101, 0, "ok"): 1, (102, 102, 0, "ok"): float("nan")})
    assert (100, 100, 0, "ok") not in idx and (101, 101, 0, "ok") not in idx
    assert len(_logs(tmp_path / "index")) == 4
    assert len(CacheIndex(tmp_path / "index")) == 53


def test_remove(tmp_path: pathlib.Path) -> None:
    idx = CacheIndex(tmp_path / "index")
    idx.update({K1: 1, K2: 2})
    assert idx.remove(K1) is True
    assert idx.remove(K1) is False
    assert idx.remove(K3) is False
    assert K1 not in idx and len(idx) == 1
    b = CacheIndex(tmp_path / "index")
    assert K1 not in b and b.get(K2) == 2 and len(b) == 1
    b.insert(K1, "back")
    idx.refresh()
    assert idx.get(K1) == "back"
    assert [k for k, _ in idx.entries()] == sorted([K1, K2])


def test_refresh_sees_other_handles_commits(tmp_path: pathlib.Path) -> None:
    a = CacheIndex(tmp_path / "index")
    b = CacheIndex(tmp_path / "index")
    a.insert(K1, "from a")
    assert K1 not in b  # no I/O on reads: b sees it after a refresh
    b.refresh()
    assert b.get(K1) == "from a"
    b.insert(K1, "from b")  # later stamp: wins
    b.remove(K2)
    a.refresh()
    assert a.get(K1) == "from b"
    b.remove(K1)
    a.refresh()
    assert K1 not in a and len(a) == 0
    assert len(CacheIndex(tmp_path / "index")) == 0


def test_last_writer_wins_between_handles(tmp_path: pathlib.Path) -> None:
    handles = [CacheIndex(tmp_path / "index", compact_after=3) for _ in range(3)]
    for round_ in range(5):
        for i, h in enumerate(handles):
            h.insert(K1, [round_, i])
    fresh = CacheIndex(tmp_path / "index")
    assert fresh.get(K1) == [4, 2]
    for h in handles:
        h.refresh()
        assert h.get(K1) == [4, 2]


def test_compaction_leaves_one_snapshot_and_loses_nothing(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    idx = CacheIndex(path, compact_after=1000)
    for i in range(40):
        idx.insert((i, i + 1, 0, "c"), {"n": i})
    idx.remove((0, 1, 0, "c"))
    other = CacheIndex(path, compact_after=1000)
    other.insert((99, 100, 0, "other"), "o")
    assert len(_logs(path)) == 42 and _snaps(path) == []
    assert idx.compact() is True
    assert _logs(path) == [] and len(_snaps(path)) == 1
    expected = {(i, i + 1, 0, "c"): {"n": i} for i in range(1, 40)}
    expected[(99, 100, 0, "other")] = "o"
    for h in (idx, CacheIndex(path)):
        assert dict(h.entries()) == expected
    other.refresh()
    assert dict(other.entries()) == expected
    # Compacting again: still one snapshot with the same content.
    assert idx.compact(timeout=1.0) is True
    assert len(_snaps(path)) == 1 and _logs(path) == []
    assert dict(CacheIndex(path).entries()) == expected
    assert verify_index(path).ok


def test_auto_compaction_bounds_the_file_count(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    idx = CacheIndex(path, compact_after=4)
    for i in range(30):
        idx.insert((i, i, 0, "c"), i)
    assert len(_snaps(path)) == 1
    assert len(_logs(path)) < 4
    assert len(CacheIndex(path)) == 30
    report = verify_index(path)
    assert report.ok and report.good_files == len(_logs(path)) + 1


def test_options(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="compact_after"):
        CacheIndex(tmp_path / "index", compact_after=0)
    idx = CacheIndex(tmp_path / "index", host="node 1/rack-2", use_flock=False, fsync=False)
    assert idx.host == "node_1_rack_2"
    idx.insert(K1, 1)
    assert any("node_1_rack_2" in n for n in _logs(tmp_path / "index"))
    assert CacheIndex(tmp_path / "index").get(K1) == 1
    with pytest.raises(ValueError, match="timeout"):
        idx.compact(timeout=-1)


def test_threads_share_one_handle(tmp_path: pathlib.Path) -> None:
    idx = CacheIndex(tmp_path / "index", compact_after=8, fsync=False)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(25):
                idx.insert((t, i, 0, "thread"), [t, i])
                assert idx.get((t, i, 0, "thread")) == [t, i]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(idx) == 100 and len(CacheIndex(tmp_path / "index")) == 100


def test_write_atomic(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "blob.bin"
    write_atomic(target, b"one")
    write_atomic(str(target), b"two", fsync=False)
    assert target.read_bytes() == b"two"
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "x").write_bytes(b"x")
    with pytest.raises(CacheError) as ei:
        write_atomic(tmp_path / "folder", b"data")
    assert ei.value.filename
    assert _temps(tmp_path) == []


# ----- errors ------------------------------------------------------------------


def test_exception_hierarchy() -> None:
    assert issubclass(CacheError, OSError)
    assert issubclass(CorruptIndexError, CacheError)
    assert issubclass(LockTimeoutError, CacheError)
    assert issubclass(CacheWarning, UserWarning)
    assert fxpiece.CacheError is CacheError


def test_unusable_path_gives_cache_error_with_filename(tmp_path: pathlib.Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(CacheError) as ei:
        CacheIndex(tmp_path / "afile" / "index")
    e = ei.value
    assert isinstance(e, OSError)
    assert e.errno == errno.ENOTDIR
    assert e.filename and str(tmp_path / "afile") in e.filename
    assert str(tmp_path / "afile") in str(e)


def test_file_at_index_path_is_moved_aside(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    path.write_bytes(b"{(1, 8, 0, 'inductor'): ('h', 'p')}")  # e.g. an old-style index
    with pytest.warns(CacheWarning, match="moved aside"):
        idx = CacheIndex(path)
    assert path.is_dir() and len(idx) == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("index.corrupt-")]
    assert len(aside) == 1 and re.fullmatch(r"index\.corrupt-\d+(\.\d+)?", aside[0].name)
    assert aside[0].read_bytes().startswith(b"{(1, 8")
    idx.insert(K1, 1)
    with no_warnings():
        assert CacheIndex(path).get(K1) == 1


# --- read-only folder and full disk: run in a tmpfs mounted for the test -------

# Child processes import only the native module (importing fxpiece does not
# import torch; the backend's modules load lazily).
_LOAD_NATIVE = "from fxpiece import _native as native\n"

_MOUNT_MAIN = r"""
import errno, json, os, subprocess, sys, traceback, warnings
from fxpiece.errors import CacheError
CacheIndex = native.CacheIndex

mnt, size = sys.argv[1], sys.argv[2]
r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mnt],
                   capture_output=True, text=True)
if r.returncode != 0:
    print(json.dumps({"mount_failed": (r.stderr or r.stdout).strip()}))
    sys.exit(0)

def remount_ro():
    subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)

def err(e):
    return {"type": type(e).__name__, "errno": e.errno, "filename": e.filename, "msg": str(e),
            "is_cache_error": isinstance(e, CacheError), "is_oserror": isinstance(e, OSError)}

def temps(path):
    return sorted(n for n in os.listdir(path) if n.startswith(".tmp-"))

try:
    out = scenario(mnt)
except BaseException:
    out = {"crashed": traceback.format_exc()}
finally:
    subprocess.run(["umount", "-l", mnt], capture_output=True)
print(json.dumps(out))
"""


def _run_mounted(tmp_path: pathlib.Path, scenario: str, size: str) -> dict[str, object]:
    """Run `scenario(mnt)` in a child over a fresh tmpfs; skip if no way to mount one."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = _LOAD_NATIVE + textwrap.dedent(scenario) + "\n" + _MOUNT_MAIN
    launchers: list[list[str]] = []
    if shutil.which("unshare"):
        # A private mount namespace (user namespace: works unprivileged too).
        launchers.append(["unshare", "--user", "--map-root-user", "--mount"])
    if os.geteuid() == 0:
        launchers.append([])
    reasons = []
    for launcher in launchers:
        proc = subprocess.run(
            [*launcher, sys.executable, "-c", code, str(mnt), size],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = proc.stdout.strip().splitlines()
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]  # the scenario crashed
        if proc.returncode != 0 or not lines:
            reasons.append(f"{launcher or 'direct'}: rc={proc.returncode} {proc.stderr[-300:]}")
            continue
        result: dict[str, object] = json.loads(lines[-1])
        if "mount_failed" in result:
            reasons.append(f"{launcher or 'direct'}: {result['mount_failed']}")
            continue
        assert "crashed" not in result, result.get("crashed")
        return result
    pytest.skip("cannot mount a tmpfs here (needs root or user namespaces): " + "; ".join(reasons))


_READ_ONLY = """
def scenario(mnt):
    path = os.path.join(mnt, "index")
    idx = CacheIndex(path, compact_after=1000)
    idx.insert((1, 8, 0, "inductor"), "a/1")
    idx.insert((9, 16, 0, "inductor"), "a/2")
    # A corrupt file that cannot be moved aside once the folder is read-only.
    with open(os.path.join(path, "log-99999999999999999999-x-1-0.json"), "wb") as f:
        f.write(b"garbage")
    before = sorted(os.listdir(path))
    remount_ro()
    res = {"before": before}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ro = CacheIndex(path)
        res["open_warnings"] = [str(x.message) for x in w]
        res["len"] = len(ro)
        res["get"] = ro.get((1, 8, 0, "inductor"))
        ro.refresh()
        res["warnings_after_refresh"] = len(w)
    for name, op in [
        ("insert", lambda: ro.insert((2, 2, 0, "c"), "x")),
        ("update", lambda: ro.update({(3, 3, 0, "c"): "y"})),
        ("remove", lambda: ro.remove((1, 8, 0, "inductor"))),
        ("old_handle_insert", lambda: idx.insert((4, 4, 0, "c"), "z")),
        ("compact", lambda: ro.compact(timeout=1.0)),
        ("new_folder", lambda: CacheIndex(os.path.join(mnt, "other"))),
    ]:
        try:
            op()
            res[name] = None
        except Exception as e:
            res[name] = err(e)
    res["after"] = sorted(os.listdir(path))
    res["len_after"] = len(CacheIndex(path))
    return res
"""


def test_read_only_folder_gives_clear_error(tmp_path: pathlib.Path) -> None:
    res = _run_mounted(tmp_path, _READ_ONLY, "1m")
    assert res["len"] == 2 and res["get"] == "a/1"
    (warning,) = res["open_warnings"]  # type: ignore[misc]
    assert "corrupt" in warning and "could not be moved aside" in warning
    assert res["warnings_after_refresh"] == 1, "a known-bad file is reported once per handle"
    for op in ("insert", "update", "remove", "old_handle_insert", "compact", "new_folder"):
        e = res[op]
        assert isinstance(e, dict), f"{op} did not fail"
        assert e["type"] == "CacheError" and e["is_cache_error"] and e["is_oserror"], e
        assert e["errno"] == errno.EROFS, e
        assert e["filename"] and str(tmp_path / "mnt") in e["filename"], e
        assert "not writable" in e["msg"], e
    # Nothing half-written, nothing left behind.
    assert res["after"] == res["before"]
    assert not any(".tmp-" in n for n in res["after"])  # type: ignore[union-attr]
    assert res["len_after"] == 2


_FULL_DISK = """
def scenario(mnt):
    path = os.path.join(mnt, "index")
    idx = CacheIndex(path, compact_after=4)
    committed, failure = [], None
    for i in range(200):
        key = (i, i + 1, 0, "inductor")
        try:
            idx.insert(key, {"blob": "x" * 1500, "i": i})
        except Exception as e:
            failure = err(e)
            failed_key = list(key)
            break
        committed.append(list(key))
    res = {"committed": committed, "failure": failure, "temps": temps(path)}
    if failure is None:
        return res
    res["failed_key"] = failed_key
    # A batch that can never fit: one failed commit, nothing half-written.
    try:
        idx.update({(1000 + j, 0, 0, "big"): "y" * 4000 for j in range(40)})
        res["big_failure"] = None
    except Exception as e:
        res["big_failure"] = err(e)
    res["temps_after_big"] = temps(path)
    # The handle still works for reads; a fresh one sees every committed entry.
    res["still_readable"] = idx.get(tuple(committed[0])) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh = CacheIndex(path)
        res["fresh_keys"] = [list(k) for k in fresh.keys()]
    res["verify_ok"] = not native.verify_index(path)[1]
    return res
"""


def test_full_disk_gives_enospc_and_no_temp_file(tmp_path: pathlib.Path) -> None:
    res = _run_mounted(tmp_path, _FULL_DISK, "64k")
    e = res["failure"]
    assert isinstance(e, dict), "the 64 KiB tmpfs never filled up"
    assert e["type"] == "CacheError" and e["is_cache_error"], e
    assert e["errno"] == errno.ENOSPC, e
    assert "disk is full" in e["msg"], e
    assert e["filename"] and str(tmp_path / "mnt" / "index") in e["filename"], e
    assert res["temps"] == []
    big = res["big_failure"]
    assert isinstance(big, dict) and big["errno"] == errno.ENOSPC, big
    assert res["temps_after_big"] == []
    committed = {tuple(k) for k in res["committed"]}  # type: ignore[union-attr]
    fresh = {tuple(k) for k in res["fresh_keys"]}  # type: ignore[union-attr]
    assert committed, "nothing could be committed at all"
    assert fresh == committed, "every commit that returned is there, the failed one is not"
    assert tuple(res["failed_key"]) not in fresh  # type: ignore[arg-type]
    assert res["still_readable"] and res["verify_ok"]


# ----- corruption ----------------------------------------------------------------


def _corrupt(path: pathlib.Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "zero-byte":
        path.write_bytes(b"")
    elif how == "random-bytes":
        path.write_bytes(random.Random(0).randbytes(300))
    elif how == "wrong-version":
        assert data.startswith(b"FXPIECE-INDEX v1 ")
        path.write_bytes(data.replace(b"FXPIECE-INDEX v1 ", b"FXPIECE-INDEX v999 ", 1))
    elif how == "flipped-byte":
        b = bytearray(data)
        b[-10] ^= 0x01
        path.write_bytes(bytes(b))
    else:  # pragma: no cover
        raise AssertionError(how)


CORRUPTIONS = ["truncated", "zero-byte", "random-bytes", "wrong-version", "flipped-byte"]
REASONS = {
    "truncated": "truncated",
    "zero-byte": "empty",
    "random-bytes": "magic|header",
    "wrong-version": "version",
    "flipped-byte": "checksum",
}


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_corrupt_log_is_moved_aside_and_treated_as_missing(
    tmp_path: pathlib.Path, how: str
) -> None:
    path = tmp_path / "index"
    a = CacheIndex(path, compact_after=1000)
    a.insert(K1, 1)
    a.insert(K2, 2)
    a.insert(K3, 3)
    logs = _logs(path)
    assert len(logs) == 3
    victim = path / logs[1]  # stamps sort by time: this is K2's commit
    _corrupt(victim, how)

    with pytest.warns(CacheWarning, match="corrupt") as rec:
        b = CacheIndex(path)
    assert len(rec) == 1
    assert logs[1] in str(rec[0].message) and "moved aside" in str(rec[0].message)
    assert re.search(REASONS[how], str(rec[0].message)), str(rec[0].message)
    assert b.get(K1) == 1 and K2 not in b and b.get(K3) == 3 and len(b) == 2
    assert not victim.exists()
    aside = [n for n in os.listdir(path) if n.startswith(logs[1] + ".corrupt-")]
    assert len(aside) == 1 and re.fullmatch(re.escape(logs[1]) + r"\.corrupt-\d+(\.\d+)?", aside[0])
    # The handle still works; nothing else is reported again.
    with no_warnings():
        b.insert(K2, "recompiled")
        b.refresh()
        c = CacheIndex(path)
        assert c.get(K2) == "recompiled" and len(c) == 3
        assert verify_index(path).ok
        assert b.compact() is True
        assert len(CacheIndex(path)) == 3


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_corrupt_snapshot_is_treated_as_empty(tmp_path: pathlib.Path, how: str) -> None:
    path = tmp_path / "index"
    a = CacheIndex(path)
    a.update({(i, i, 0, "c"): i for i in range(20)})
    a.compact()
    (snap,) = _snaps(path)
    _corrupt(path / snap, how)
    with pytest.warns(CacheWarning, match=re.escape(snap)):
        b = CacheIndex(path)
    assert len(b) == 0
    b.insert(K1, "new")
    with no_warnings():
        assert dict(CacheIndex(path).entries()) == {K1: "new"}


def test_corrupt_file_appearing_under_a_live_handle(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    a = CacheIndex(path)
    a.insert(K1, 1)
    bad = path / "log-99999999999999999999-otherhost-1-0000000000000000.json"
    bad.write_bytes(b"FXPIECE-INDEX v1 blake3=00 len=2\n{}")
    with pytest.warns(CacheWarning, match="checksum"):
        a.refresh()
    assert not bad.exists()
    assert a.get(K1) == 1
    a.insert(K2, 2)
    with no_warnings():
        a.refresh()
        assert len(CacheIndex(path)) == 2


def test_verify_index_and_verify_index_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    a = CacheIndex(path, compact_after=1000)
    a.update({K1: 1, K2: 2})
    a.insert(K3, 3)
    report = verify_index(path)
    assert report.ok and report.good_files == 2 and report.problems == ()
    first, second = (path / n for n in _logs(path))
    assert verify_index_file(first) == 2
    assert verify_index_file(str(second)) == 1

    _corrupt(second, "flipped-byte")
    with pytest.raises(CorruptIndexError, match="checksum") as ei:
        verify_index_file(second)
    assert isinstance(ei.value, CacheError) and isinstance(ei.value, OSError)
    assert ei.value.filename == str(second)

    report = verify_index(path)
    assert not report.ok and report.good_files == 1
    (problem,) = report.problems
    assert problem.file == str(second) and "checksum" in problem.reason
    assert problem.moved_to is None and second.exists()  # report only

    report = verify_index(path, repair=True)
    (problem,) = report.problems
    assert problem.moved_to and problem.moved_to.startswith(str(second) + ".corrupt-")
    assert not second.exists() and os.path.exists(problem.moved_to)
    assert verify_index(path).ok

    with pytest.raises(CacheError) as missing:
        verify_index_file(path / "log-nope.json")
    assert missing.value.errno == errno.ENOENT


@pytest.mark.parametrize("how", ["zero-byte", "wrong-version", "truncated"])
def test_verify_index_file_reasons(tmp_path: pathlib.Path, how: str) -> None:
    path = tmp_path / "index"
    CacheIndex(path).insert(K1, 1)
    (log,) = _logs(path)
    _corrupt(path / log, how)
    with pytest.raises(CorruptIndexError, match=REASONS[how]):
        verify_index_file(path / log)


# ----- locking -------------------------------------------------------------------


def test_lock_timeout_and_takeover_after_sigkill(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    idx = CacheIndex(path, compact_after=2)
    idx.insert(K1, 1)
    lock = path / "LOCK"
    holder = subprocess.Popen(
        program_argv("hold_flock", lock), stdout=subprocess.PIPE, text=True, env=program_env()
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(LockTimeoutError) as ei:
            idx.compact(timeout=0.05)
        assert time.monotonic() - t0 < 2.0
        e = ei.value
        assert isinstance(e, CacheError) and isinstance(e, OSError)
        assert e.filename == str(lock)
        assert e.errno == errno.ETIMEDOUT
        assert "LOCK" in str(e)
        # Without a timeout, compaction is skipped rather than waited for...
        assert idx.compact() is False
        # ...and commits never wait for the lock (auto-compaction is skipped too).
        t0 = time.monotonic()
        for i in range(6):
            idx.insert((i, i, 5, "while-locked"), i)
        assert time.monotonic() - t0 < 5.0
        assert len(CacheIndex(path)) == 7
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # The kernel freed the dead holder's lock: no stale lock to clean up.
    assert idx.compact(timeout=10.0) is True
    assert len(_snaps(path)) == 1 and _logs(path) == []
    assert len(CacheIndex(path)) == 7
