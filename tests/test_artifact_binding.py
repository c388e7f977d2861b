"""Artifacts are bound to the digest they are stored under (issue 23 item 2),
and anything moved aside takes its index entries with it (item 7).

A file moved or copied to another digest's path holds another meaning's
code: whatever path finds it (an index handle, a lookup by digest, ``put``),
it is corrupt, moved aside and never run. A ``v1`` file (no digest in its
header) is used only through an index handle that recorded its checksum.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PyRunner

from fxpiece.cache.entries import KernelsKey, decode_key
from fxpiece.cache.index import CacheIndex
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.model import ModelCache
from fxpiece.cache.store import ArtifactStore, checksum, decode_artifact, encode_artifact
from fxpiece.cache.trust import ensure_private_dir

A, B = "ab" * 32, "cd" * 32


def _store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(CacheLayout(ensure_private_dir(tmp_path / "root")))


def _aside(path: Path) -> list[str]:
    return [p.name for p in path.parent.iterdir() if CacheLayout.is_quarantined(p.name)]


def test_a_file_copied_to_another_digest_is_refused_by_every_read(tmp_path: Path) -> None:
    store = _store(tmp_path)
    lay = store.layout
    handle_a = store.put(A, b"code of A")
    handle_b = store.put(B, b"code of B")
    assert lay.artifact_path(A).read_bytes().startswith(b"FXPIECE-ARTIFACT v3 digest=" + A.encode())

    def plant() -> Path:
        """B's path now holds A's file (valid header and checksum)."""
        path = lay.artifact_path(B)
        if path.exists():
            path.unlink()
        shutil.copyfile(lay.artifact_path(A), path)
        return path

    path = plant()
    assert store.read(B) is None
    assert not path.exists() and len(_aside(path)) == 1
    path = plant()
    assert store.lookup(B) == (None, True)
    assert store.existing(B) is None and store.read(A) == (b"code of A", checksum(b"code of A"))
    # Through a handle recording the planted file's own checksum too.
    path = plant()
    assert store.load({**handle_b, "blake3": handle_a["blake3"]}) is None
    assert not path.exists()
    path = plant()
    assert store.load(handle_b) is None
    assert not path.exists() and len(_aside(path)) == 4
    # put() moves it aside and stores its own payload.
    path = plant()
    handle = store.put(B, b"code of B")
    assert handle["blake3"] == checksum(b"code of B")
    assert decode_artifact(path.read_bytes(), str(path), B).payload == b"code of B"
    assert store.load(handle) == b"code of B" and len(_aside(path)) == 5


def test_a_v1_file_is_bound_only_by_its_handle(tmp_path: Path) -> None:
    store = _store(tmp_path)
    path = store.layout.artifact_path(A)
    ensure_private_dir(path.parent)
    path.write_bytes(encode_artifact(b"old", None))  # written before v2
    path.chmod(0o600)
    handle = {"artifact": CacheLayout.artifact_rel(A), "blake3": checksum(b"old"), "size": 3}
    assert store.load(handle) == b"old"
    assert store.lookup(A) == (None, False) and store.read(A) is None
    assert path.exists(), "a v1 file found by digest alone is left alone"
    # A v1 file a handle does not bind is moved aside.
    assert store.load({**handle, "blake3": checksum(b"other")}) is None
    assert not path.exists() and len(_aside(path)) == 1
    # put() replaces one: moved aside first, then its own is stored (v2).
    path.write_bytes(encode_artifact(b"old", None))
    path.chmod(0o600)
    new = store.put(A, b"new")
    assert new["blake3"] == checksum(b"new") and len(_aside(path)) == 2
    assert store.existing(A) == new and store.load(new) == b"new"
    # The old handle does not load the new file, which stays (no ping-pong).
    assert store.load(handle) is None and store.load(new) == b"new"


def test_moving_aside_drops_the_entries_that_point_at_it(tmp_path: Path) -> None:
    layout = CacheLayout(ensure_private_dir(tmp_path / "root"))
    mc = ModelCache(layout, "ef" * 32, "backbone")
    other = ModelCache(layout, "ef" * 32, "other")
    h_a = mc.artifacts.put(A, b"a")
    h_b = mc.artifacts.put(B, b"b")
    for m in (mc, other):
        m.index.insert((1, 8, 0, "inductor"), {"digest": A, "handle": h_a})
        m.index.insert((1, 8, 0, "kernels"), {"digest": A, "handle": h_a})
        m.index.insert((1, 8, 2, "inductor"), {"digest": B, "handle": h_b})
    path = layout.artifact_path(A)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert mc.artifacts.load(h_a) is None  # corrupt: moved aside
    assert not path.exists()
    assert CacheIndex(str(layout.index_dir(mc.folder))).keys() == [(1, 8, 2, "inductor")]
    # Only the model cache at hand: another model's entries are its own.
    assert len(CacheIndex(str(layout.index_dir(other.folder)))) == 3
    # The one function callers use for an artifact that verified but does not load.
    assert mc.quarantine(h_b) and not layout.artifact_path(B).exists()
    assert len(CacheIndex(str(layout.index_dir(mc.folder)))) == 0
    assert not mc.quarantine({"artifact": "../x"}) and not mc.quarantine(None)


# -- end to end: fresh processes -------------------------------------------------


def _run(run_py: PyRunner, cache: Path, runs: list[tuple[str, str]]) -> dict[str, Any]:
    result: dict[str, Any] = run_py.program("mm_tags", cache, json.dumps(runs))
    for tag, r in result["out"].items():
        assert r["diff"] < 1e-4, (tag, result)
    return result


def _pieces(folder: str) -> dict[tuple[int, int, int, str], Any]:
    index = CacheIndex(str(Path(folder) / "index"), readonly=True)
    return {k: v for k, v in index.entries() if not isinstance(decode_key(k), KernelsKey)}


@pytest.mark.slow
def test_swapped_artifacts_are_never_run_for_another_digest(
    run_py: PyRunner, tmp_path: Path
) -> None:
    """Two models' artifacts swapped between their digests: a third model tag
    (loading by digest alone) recompiles, counts and moves the file aside,
    and its index records what it stored, not the other model's code."""
    cache = tmp_path / "cache"
    cold = _run(run_py, cache, [("f", "a"), ("g", "b")])
    assert cold["counters"]["num_corrupt_artifacts"] == 0
    # piece 0 of f (sin * 2) and of g (cos * 3): same shapes, other code
    (fk, fv), *_ = sorted(_pieces(cold["out"]["a"]["folder"]).items())
    (gk, gv), *_ = sorted(_pieces(cold["out"]["b"]["folder"]).items())
    assert fk[2] == gk[2] == 0 and fv["digest"] != gv["digest"]
    fpath, gpath = cache / fv["handle"]["artifact"], cache / gv["handle"]["artifact"]
    tmp = fpath.with_name("swap")
    os.rename(fpath, tmp)
    os.rename(gpath, fpath)
    os.rename(tmp, gpath)
    g_sum = gv["handle"]["blake3"]  # what fpath now holds

    warm = _run(run_py, cache, [("f", "c")])  # outputs checked against eager
    c = warm["counters"]
    assert c["num_corrupt_artifacts"] == 1, warm
    assert c["num_inductor_compiles"] == 1 and c["num_cache_hits"] == 1, warm
    assert any("not the one stored under its digest" in m for m in warm["logs"]), warm["logs"]
    assert _aside(fpath), "the swapped file was moved aside"
    entries = _pieces(warm["out"]["c"]["folder"])
    value = entries[fk]
    assert value["digest"] == fv["digest"] and value["handle"]["blake3"] != g_sum
    data = fpath.read_bytes()
    assert decode_artifact(data, str(fpath), fv["digest"]).checksum == value["handle"]["blake3"]
    # The next start of the new tag loads what was recompiled.
    again = _run(run_py, cache, [("f", "c")])
    assert again["counters"]["num_corrupt_artifacts"] == 0, again
    assert again["counters"]["num_inductor_compiles"] == 0, again


@pytest.mark.slow
def test_a_corrupt_kernel_bundle_is_reported_by_one_start_only(
    run_py: PyRunner, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cold = _run(run_py, cache, [("f", "a")])
    folder = cold["out"]["a"]["folder"]
    index = CacheIndex(str(Path(folder) / "index"), readonly=True)
    bundles = [v for k, v in index.entries() if isinstance(decode_key(k), KernelsKey)]
    assert bundles, "the compile built kernels"
    path = cache / bundles[0]["handle"]["artifact"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))

    first = _run(run_py, cache, [("f", "a")])  # outputs checked against eager
    assert first["counters"]["num_corrupt_artifacts"] == 1, first
    warned = [m for m in first["logs"] if "kernel bundle" in m]
    assert len(warned) == 1, first["logs"]
    assert _aside(path) and not path.exists()
    index.refresh()
    assert all(
        v["handle"]["artifact"] != bundles[0]["handle"]["artifact"] for _, v in index.entries()
    )

    second = _run(run_py, cache, [("f", "a")])
    assert second["counters"]["num_corrupt_artifacts"] == 0, second
    assert not [m for m in second["logs"] if "corrupt" in m], second["logs"]
    assert second["counters"]["num_inductor_compiles"] == 0, second
    assert torch.tensor(second["out"]["a"]["diff"]) < 1e-4


@pytest.mark.slow
def test_a_deleted_kernel_bundle_is_reported_by_one_start_only(
    run_py: PyRunner, tmp_path: Path
) -> None:
    """A bundle removed outright (nothing to move aside): its entry goes with
    the first start's warning; the next start is silent."""
    cache = tmp_path / "cache"
    cold = _run(run_py, cache, [("f", "a")])
    index = CacheIndex(str(Path(cold["out"]["a"]["folder"]) / "index"), readonly=True)
    bundles = [v for k, v in index.entries() if isinstance(decode_key(k), KernelsKey)]
    assert bundles, "the compile built kernels"
    (cache / bundles[0]["handle"]["artifact"]).unlink()

    first = _run(run_py, cache, [("f", "a")])  # outputs checked against eager
    assert first["counters"]["num_corrupt_artifacts"] == 1, first
    assert len([m for m in first["logs"] if "kernel bundle" in m]) == 1, first["logs"]
    index.refresh()
    assert all(v.get("handle") != bundles[0]["handle"] for _, v in index.entries())

    second = _run(run_py, cache, [("f", "a")])
    assert second["counters"]["num_corrupt_artifacts"] == 0, second
    assert not [m for m in second["logs"] if "kernel bundle" in m], second["logs"]
