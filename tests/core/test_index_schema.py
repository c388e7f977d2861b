"""The typed index schema (fxpiece.cache.entries): every key kind round-trips
through its schema-2 raw form and is read from today's schema-1 form to the
same typed key; the raw forms fit the native index's key type; hostile
values (wrong types, missing or huge digests, bad files) decode to None,
never raise; EntryIndex reads schema 2, then schema 1, and writes schema 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fxpiece.cache.entries import (
    MODEL_KERNELS,
    SCHEMA,
    AotKey,
    Entry,
    EntryIndex,
    KernelsKey,
    PieceKey,
    UnknownKey,
    Unsupported,
    decode_key,
    decode_value,
)
from fxpiece.cache.index import CacheIndex

KEYS = [
    PieceKey(1, 16, 0, "inductor"),
    PieceKey(8, 8, 6, "eager"),
    PieceKey(1, 16, 2, "kernels-like:compiler"),
    KernelsKey(1, 16, 0),
    MODEL_KERNELS,
    AotKey(0),
    AotKey(7),
]
HANDLE = {"artifact": "artifacts/ab/" + "ab" * 32, "blake3": "c" * 64, "size": 10}
DIGEST = "ab" * 32


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_keys_round_trip_in_both_schemas(key: Any) -> None:
    assert decode_key(key.to_raw()) == key
    assert decode_key(key.legacy_raw()) == key
    assert decode_key(list(key.to_raw())) == key  # as JSON gives it (remote fields)
    assert key.to_raw() != key.legacy_raw()
    assert key.to_raw()[3].startswith(f"v{SCHEMA}:")


def test_schema_one_sentinels_are_what_main_wrote() -> None:
    assert MODEL_KERNELS.legacy_raw() == (0, 0, -1, "kernels")
    assert KernelsKey(1, 16, 2).legacy_raw() == (1, 16, 2, "kernels")
    assert AotKey(3).legacy_raw() == (3, 0, -2, "aot")
    assert PieceKey(1, 16, 2, "inductor").legacy_raw() == (1, 16, 2, "inductor")
    assert PieceKey(1, 16, 2, "inductor").kernels() == KernelsKey(1, 16, 2)
    assert MODEL_KERNELS.model_wide and not KernelsKey(1, 16, 2).model_wide


def test_the_kinds_never_collide() -> None:
    raws = {k.to_raw() for k in KEYS} | {k.legacy_raw() for k in KEYS}
    assert len(raws) == 2 * len(KEYS)
    # The model's bundle and a piece's bundle at (0, 0, 0) stay apart.
    assert decode_key(KernelsKey(0, 0, 0).to_raw()) == KernelsKey(0, 0, 0) != MODEL_KERNELS


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "x",
        (1, 2, 3),
        (1, 2, 3, "a", 5),
        (1, 2, 3, 4),
        (1.0, 2, 3, "inductor"),
        (True, 2, 3, "inductor"),
        (1, 2, 3, b"inductor"),
        (1, 2, 3, ""),
        (1, 2, 3, "v2:piece:"),
        (1, 2, 3, "v2:what"),
        (1, 2, 3, "v3:piece:inductor"),  # a later schema: not read, not misread
        (1, 0, 0, "v2:kernels:model"),
        (1, 1, 0, "v2:aot"),
        (-1, 0, 0, "v2:aot"),
        (1, 2, -2, "aot"),
    ],
    ids=repr,
)
def test_anything_else_is_an_unknown_key(raw: Any) -> None:
    assert isinstance(decode_key(raw), UnknownKey)


def test_native_index_stores_every_raw_form(tmp_path: Path) -> None:
    index = CacheIndex(str(tmp_path / "index"))
    for k in KEYS:
        index.insert(k.to_raw(), {"digest": DIGEST, "handle": HANDLE})
        index.insert(k.legacy_raw(), {"digest": DIGEST, "handle": HANDLE})
    again = CacheIndex(str(tmp_path / "index"), readonly=True)
    assert {decode_key(k) for k, _ in again.entries()} == set(KEYS)


@pytest.mark.parametrize(
    "value",
    [
        None,
        [],
        "digest",
        42,
        {},
        {"handle": HANDLE},
        {"digest": DIGEST},
        {"digest": DIGEST, "handle": None},
        {"digest": 7, "handle": HANDLE},
        {"digest": None, "handle": HANDLE},
        {"digest": "", "handle": HANDLE},
        {"digest": "a" * 129, "handle": HANDLE},
        {"digest": "a" * 10_000_000, "handle": HANDLE},
        {"digest": "../../etc/passwd", "handle": HANDLE},
        {"digest": "ab\ncd", "handle": HANDLE},
        {"digest": DIGEST, "handle": HANDLE, "files": "x"},
        {"digest": DIGEST, "handle": HANDLE, "files": {"m": 1}},
        {"digest": DIGEST, "handle": HANDLE, "files": [["m", "d"]]},
    ],
    ids=lambda v: repr(v)[:60],
)
def test_malformed_values_decode_to_none(value: Any) -> None:
    assert Entry.from_raw(value) is None
    for key in KEYS:
        assert decode_value(key, value) is None


def test_entries_round_trip() -> None:
    e = Entry(DIGEST, HANDLE)
    assert Entry.from_raw(e.to_raw()) == e and e.to_raw() == {"digest": DIGEST, "handle": HANDLE}
    aot = Entry(DIGEST, HANDLE, {"pkg.mod": "d" * 64, "gone": None})
    assert Entry.from_raw(aot.to_raw()) == aot
    assert e.artifact == HANDLE["artifact"] and e.names_artifact
    # A handle without an artifact (eager), and one naming a path outside.
    assert Entry(DIGEST, {"eager": True}).artifact is None
    assert not Entry(DIGEST, {"eager": True}).names_artifact
    outside = Entry(DIGEST, {"artifact": "../x"})
    assert outside.names_artifact and outside.artifact is None
    assert Entry(DIGEST, "a string handle").artifact is None
    # Extra fields of a later writer are ignored, not fatal.
    assert Entry.from_raw({**e.to_raw(), "later": 1}) == e


def test_unsupported_only_for_aot_keys() -> None:
    raw = {"unsupported": "dynamic control flow"}
    assert decode_value(AotKey(0), raw) == Unsupported("dynamic control flow")
    assert decode_value(PieceKey(1, 2, 0, "inductor"), raw) is None
    assert decode_value(AotKey(0), {"unsupported": 3}) is None
    assert decode_value(UnknownKey((1,)), {"digest": DIGEST, "handle": HANDLE}) is None
    huge = decode_value(AotKey(0), {"unsupported": "x" * 1_000_000})
    assert isinstance(huge, Unsupported) and len(huge.reason) <= 2000


def test_entry_index_reads_both_schemas_and_writes_two(tmp_path: Path) -> None:
    raw = CacheIndex(str(tmp_path / "index"))
    idx = EntryIndex(raw)
    piece = PieceKey(1, 16, 0, "inductor")
    old = Entry(DIGEST, HANDLE)
    raw.insert(piece.legacy_raw(), old.to_raw())  # as today's main writes it
    raw.insert(AotKey(0).legacy_raw(), {"digest": DIGEST, "handle": HANDLE, "files": {"m": "d"}})
    raw.insert(MODEL_KERNELS.legacy_raw(), {"digest": "bad digest", "handle": HANDLE})
    assert idx.get(piece) == old
    assert idx.value(AotKey(0)) == Entry(DIGEST, HANDLE, {"m": "d"})
    assert idx.get(MODEL_KERNELS) is None  # malformed: absent
    assert idx.get(AotKey(1)) is None
    new = Entry("cd" * 32, HANDLE)
    idx.put(piece, new)
    assert raw.get(piece.to_raw()) == new.to_raw()
    assert raw.get(piece.legacy_raw()) == old.to_raw()  # never rewritten
    assert idx.get(piece) == new  # schema 2 first
    items = dict(idx.items())
    assert items[piece] in (old, new) and items[MODEL_KERNELS] is None
    assert idx.remove(piece) and idx.get(piece) is None  # both forms gone
    assert piece.legacy_raw() not in raw and piece.to_raw() not in raw
    assert not idx.remove(piece)
    idx.put_many([(AotKey(1), Unsupported("no")), (KernelsKey(1, 16, 0), new)])
    assert idx.value(AotKey(1)) == Unsupported("no") and idx.get(AotKey(1)) is None
    assert idx.get(KernelsKey(1, 16, 0)) == new
