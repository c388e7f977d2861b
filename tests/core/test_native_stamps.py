"""Crafted but checksum-valid index files: entries stamped far in the future
(a host whose clock said year 5138) and values nested too deep. Files are
built byte for byte as a writer would (header, BLAKE3, JSON body)."""

from __future__ import annotations

import calendar
import json
import os
import pathlib
import warnings

import pytest

from fxpiece import CacheIndex, CacheWarning, CorruptIndexError, verify_index, verify_index_file
from fxpiece import _native as native

K = (1, 8, 0, "inductor")
K2 = (9, 16, 0, "inductor")
YEAR_5138 = calendar.timegm((5138, 6, 1, 0, 0, 0)) * 10**9


def _blake3(data: bytes, scratch: pathlib.Path) -> str:
    # The per-file digest of hash_files_report is BLAKE3 of the content.
    scratch.write_bytes(data)
    _, files = native.hash_files_report([str(scratch)])
    digest = files[0][1]
    assert digest is not None
    scratch.unlink()
    return digest


def craft(
    folder: pathlib.Path,
    stamp: str,
    entries: list[tuple[tuple[int, int, int, str], str]],
    removed: list[tuple[int, int, int, str]] = (),  # type: ignore[assignment]
) -> pathlib.Path:
    """A log file holding `entries` (key, raw JSON text of the value)."""
    body = (
        '{"kind":"log","stamps":'
        + json.dumps([stamp])
        + ',"entries":['
        + ",".join(f"[{k[0]},{k[1]},{k[2]},{json.dumps(k[3])},{raw},0]" for k, raw in entries)
        + '],"removed":'
        + json.dumps([[*k, 0] for k in removed])
        + "}"
    ).encode()
    digest = _blake3(body, folder.parent / "scratch")
    p = folder / f"log-{stamp}.json"
    p.write_bytes(f"FXPIECE-INDEX v1 blake3={digest} len={len(body)}\n".encode() + body + b"\n")
    assert verify_index_file(p) == len(entries) + len(removed)
    return p


def test_crafted_file_is_read_like_a_written_one(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    CacheIndex(path)
    craft(path, "00000000000000000001-h-1-0", [(K, '{"a":[1,2]}')])
    assert CacheIndex(path).get(K) == {"a": [1, 2]}


def test_an_entry_stamped_in_year_5138_does_not_freeze_its_key(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    CacheIndex(path)
    stamp = f"{YEAR_5138:020d}-skewedhost-1-0000000000000001"
    craft(path, stamp, [(K, '"from the future"'), (K2, '"also"')])
    with pytest.warns(CacheWarning, match="stamped in the future") as rec:
        a = CacheIndex(path)
    assert len(rec) == 1 and "allowed skew of 3600 s" in str(rec[0].message)
    assert a.get(K) == "from the future", "valid data is used"
    # A later insert wins: here, in a fresh handle, and after compaction.
    a.insert(K, "now")
    assert a.get(K) == "now"
    with pytest.warns(CacheWarning):
        assert CacheIndex(path).get(K) == "now"
    # remove() really removes.
    assert a.remove(K2) is True
    assert K2 not in a and a.get(K2) is None
    with pytest.warns(CacheWarning):
        b = CacheIndex(path)
    assert K2 not in b and b.get(K) == "now"
    assert b.compact(timeout=10) is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the skewed file is gone: nothing to report
        c = CacheIndex(path)
    assert c.get(K) == "now" and K2 not in c and len(c) == 1
    # Insert after remove, and again: each wins.
    c.insert(K2, "back")
    c.insert(K, "again")
    d = CacheIndex(path)
    assert d.get(K2) == "back" and d.get(K) == "again"
    # The writer's other commits are not dragged into the future.
    c.insert((33, 64, 0, "inductor"), "x")
    logs = sorted(n for n in os.listdir(path) if n.startswith("log-"))
    assert logs and all(n < "log-1" + "9" * 19 for n in logs), logs
    assert verify_index(path).ok


def test_a_stamp_one_day_ahead_is_reported_and_superseded(tmp_path: pathlib.Path) -> None:
    import time

    path = tmp_path / "index"
    CacheIndex(path)
    stamp = f"{time.time_ns() + 86_400 * 10**9:020d}-ahead-1-0"
    craft(path, stamp, [(K, "1")])
    with pytest.warns(CacheWarning, match="stamped in the future"):
        a = CacheIndex(path)
    a.insert(K, 2)
    with pytest.warns(CacheWarning):
        assert CacheIndex(path).get(K) == 2
    # A larger allowed skew accepts it silently.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert CacheIndex(path, max_clock_skew=2 * 86_400).get(K) == 2


def test_a_removal_stamped_in_the_future_does_not_hide_later_inserts(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "index"
    CacheIndex(path).insert(K, "old")
    craft(path, f"{YEAR_5138:020d}-skewed-1-0", [], removed=[K])
    with pytest.warns(CacheWarning):
        a = CacheIndex(path)
    assert K not in a
    a.insert(K, "new")
    with pytest.warns(CacheWarning):
        assert CacheIndex(path).get(K) == "new"


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def test_verify_and_get_agree_on_deeply_nested_values(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    CacheIndex(path)
    ok = craft(path, "00000000000000000001-h-1-0", [(K, _nested(100))])
    # Deeper than get could ever parse back (serde_json stops at 128).
    with pytest.raises(CorruptIndexError, match="deeper than 100"):
        craft(path, "00000000000000000002-h-1-0", [(K2, _nested(129))])
    bad = path / "log-00000000000000000002-h-1-0.json"
    report = verify_index(path)
    assert [p.file for p in report.problems] == [str(bad)]
    assert "deeper than" in report.problems[0].reason
    with pytest.warns(CacheWarning, match="corrupt"):
        idx = CacheIndex(path)
    value = idx.get(K)  # what is accepted can be read back
    for _ in range(100):
        assert isinstance(value, list)
        value = value[0]
    assert value == 1
    assert idx.get(K2) is None and K2 not in idx
    assert not bad.exists(), "moved aside"
    assert verify_index(path).ok and ok.exists()
    # Depth 101 too: verify and load use the same limit.
    with pytest.raises(CorruptIndexError):
        craft(path, "00000000000000000003-h-1-0", [(K2, _nested(101))])
