"""A cache written before the typed index schema (schema 1: the sentinel
keys ``(start, end, piece, compiler)``, ``(0, 0, -1, "kernels")``,
``(start, end, piece, "kernels")``, ``(n, 0, -2, "aot")``) still hits: a warm
start from it loads every piece and its ahead-of-time entry, compiles
nothing, gives the same output, and writes nothing in the old shape.

The old index is made from a real cold start by rewriting every entry to
the exact keys the previous main wrote (spelled out here, not taken from
the code under test)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import PyRunner

from fxpiece.cache.entries import (
    SCHEMA,
    AotKey,
    EntryIndex,
    KernelsKey,
    PieceKey,
    UnknownKey,
    decode_key,
)
from fxpiece.cache.index import CacheIndex


def _schema_one(key: PieceKey | KernelsKey | AotKey) -> tuple[int, int, int, str]:
    """The key today's main (before schema 2) wrote for ``key``
    (``fxpiece/cache/keys.py`` of that main)."""
    if isinstance(key, PieceKey):
        return (key.start, key.end, key.piece, key.compiler)
    if isinstance(key, KernelsKey):
        return (0, 0, -1, "kernels") if key.piece is None else (*key.legacy_raw()[:3], "kernels")
    return (key.n, 0, -2, "aot")


def _rewrite_as_schema_one(root: Path) -> dict[str, int]:
    """Every index under ``root`` rewritten to schema-1 keys (values as they
    are: their shape did not change); how many keys of each kind."""
    kinds: dict[str, int] = {}
    for index_dir in root.glob("models/*/*/index"):
        index = CacheIndex(str(index_dir))
        entries = index.entries()
        for raw, value in entries:
            key = decode_key(raw)
            assert not isinstance(key, UnknownKey), raw
            assert raw[3].startswith(f"v{SCHEMA}:"), raw  # the cold start wrote schema 2
            index.remove(raw)
            index.insert(_schema_one(key), value)
            kinds[key.kind] = kinds.get(key.kind, 0) + 1
        index.compact()
        assert all(not k[3].startswith("v") for k, _ in CacheIndex(str(index_dir)).entries())
    return kinds


def _start(run_py: PyRunner, root: Path, compiler: str) -> dict[str, Any]:
    r: dict[str, Any] = run_py.program(
        "toy_eager_start", json.dumps({"root": str(root), "compiler": compiler})
    )
    return r


@pytest.mark.parametrize("compiler", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_schema_one_cache_still_hits(run_py: PyRunner, tmp_path: Path, compiler: str) -> None:
    root = tmp_path / "cache"
    cold = _start(run_py, root, compiler)
    assert cold["path"] == "aot-capture", cold
    kinds = _rewrite_as_schema_one(root)
    assert kinds.get("piece", 0) >= 2 and kinds.get("aot") == 1, kinds
    if compiler == "inductor":
        assert kinds.get("kernels", 0) >= 1, kinds

    warm = _start(run_py, root, compiler)
    c = warm["counters"]
    assert warm["path"] == "aot-load", warm
    assert not {k for k in c if k.endswith("_compiles")}, c
    assert c.get("num_cache_hits", 0) >= kinds["piece"] and not c.get("num_corrupt_artifacts"), c
    assert warm["out"] == cold["out"]
    # Nothing was recorded again: the old entries serve as they are.
    for index_dir in root.glob("models/*/*/index"):
        typed = EntryIndex(CacheIndex(str(index_dir), readonly=True))
        for raw, _ in typed.index.entries():
            assert not raw[3].startswith("v"), raw
        assert all(v is not None for _, v in typed.items())
    assert any(
        EntryIndex(CacheIndex(str(d), readonly=True)).get(AotKey(0)) is not None
        for d in root.glob("models/*/*.aot/index")
    )
