"""Signed artifacts under real warm starts (fresh processes, real Inductor).

A cache built by a cold start is signed by this session's builder key
(tests/conftest.py keeps it out of the user's ~/.config). What another
builder signed, what a revoked key signed, and unsigned files in a shared
root never load: they are counted, moved aside and compiled again, and the
output stays right. A cache written before v3 (unsigned v2 files, as the
previous main wrote them) still hits from a root of your own.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PyRunner, run_toy_subprocess

from fxpiece import signing
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.store import decode_artifact, encode_artifact
from fxpiece.toy_llama import ATTENTION_OP

pytestmark = pytest.mark.slow  # real Inductor starts in fresh processes


def spec(cache: Path, out: Path, **config: Any) -> dict[str, Any]:
    return {
        "layers": 1,
        "config": {
            "splitting_ops": [ATTENTION_OP],
            "cache_dir": str(cache),
            "max_num_tokens": 32,
            **config,
        },
        "sizes": [5],
        "out": str(out),
    }


@pytest.fixture(scope="module")
def built() -> Iterator[tuple[Path, Path, int]]:
    """(cache, outputs of the cold run, its Inductor compiles)."""
    base = Path(tempfile.mkdtemp(prefix="fxpiece-signed-"))
    cache = base / "cache"
    cold = run_toy_subprocess(PyRunner(), spec(cache, base / "cold.pt"))
    compiles = cold["diff"]["num_inductor_compiles"]
    assert compiles > 0
    yield cache, base / "cold.pt", compiles
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def cache(built: tuple[Path, Path, int], tmp_path: Path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(built[0], copy, symlinks=True)
    return copy


def artifacts(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "artifacts").glob("*/*") if "." not in p.name)


def warm(
    run_py: PyRunner,
    cache: Path,
    out: Path,
    env: dict[str, str | None] | None = None,
    **config: Any,
) -> dict[str, Any]:
    return run_toy_subprocess(run_py, spec(cache, out, **config), env=env)


def same_output(out: Path, built: tuple[Path, Path, int]) -> bool:
    return torch.equal(torch.load(out)[5], torch.load(built[1])[5])


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def plant(cache: Path, marker: Path, *, signed_by_other: Path | None) -> int:
    """Replace every stored artifact by a pickle that writes ``marker`` when
    loaded, with a valid checksum and the digest binding; signed by another
    builder (a process with the key at ``signed_by_other``) or unsigned
    (``v2``). How many were planted."""
    evil = pickle.dumps(_Evil(str(marker)))
    paths = artifacts(cache)
    for p in paths:
        if signed_by_other is None:
            p.write_bytes(encode_artifact(evil, p.name))
    if signed_by_other is not None:
        code = (
            "import sys\nfrom pathlib import Path\n"
            "from fxpiece.cache.store import encode_artifact\n"
            "from fxpiece.signing import builder_key\n"
            "k = builder_key()\n"
            "evil = bytes.fromhex(sys.argv[1])\n"
            "for p in map(Path, sys.argv[2:]):\n"
            "    p.write_bytes(encode_artifact(evil, p.name, key=k))\n"
        )
        env = {**os.environ, signing.KEY_FILE_ENV: str(signed_by_other)}
        subprocess.run(
            [sys.executable, "-c", code, evil.hex(), *map(str, paths)],
            env=env,
            check=True,
            timeout=60,
        )
    return len(paths)


@pytest.mark.parametrize("how", ["signed-by-another-builder", "unsigned-in-a-shared-root"])
def test_planted_pickle_never_runs_and_is_recompiled(
    built: tuple[Path, Path, int], cache: Path, run_py: PyRunner, tmp_path: Path, how: str
) -> None:
    marker = tmp_path / "pwned"
    other = tmp_path / "other" / "key" if how == "signed-by-another-builder" else None
    n = plant(cache, marker, signed_by_other=other)
    config: dict[str, Any] = {"allow_untrusted_cache": True} if other is None else {}
    r = warm(run_py, cache, tmp_path / "warm.pt", **config)
    assert not marker.exists(), "a planted pickle ran"
    assert r["diff"]["num_corrupt_artifacts"] >= 1, r["diff"]
    assert r["diff"]["num_inductor_compiles"] >= 1
    assert same_output(tmp_path / "warm.pt", built)
    assert len(list((cache / "artifacts").glob("*/*.corrupt-*"))) == n  # all moved aside
    again = warm(run_py, cache, tmp_path / "again.pt", **config)
    assert again["diff"].get("num_inductor_compiles", 0) == 0, again["diff"]
    assert again["diff"].get("num_corrupt_artifacts", 0) == 0
    assert not marker.exists()


def test_revoked_key_is_refused_then_rebuilt(
    built: tuple[Path, Path, int], cache: Path, run_py: PyRunner, tmp_path: Path
) -> None:
    own = signing.load_key().public  # the session key the cold start signed with
    new_key = tmp_path / "new" / "key"
    env: dict[str, str | None] = {
        signing.TRUSTED_KEYS_ENV: f"-{own}",
        signing.KEY_FILE_ENV: str(new_key),
    }
    r = warm(run_py, cache, tmp_path / "warm.pt", env=env)
    assert r["diff"]["num_corrupt_artifacts"] >= 1, r["diff"]
    assert r["diff"]["num_inductor_compiles"] == built[2]
    assert same_output(tmp_path / "warm.pt", built)
    new = signing.load_key(new_key).public
    for p in artifacts(cache):  # everything now stored is signed by the new key
        art = decode_artifact(p.read_bytes(), str(p), p.name)
        assert art.signer == new
    # The revoked key's files are not trusted back by the next start either.
    again = warm(run_py, cache, tmp_path / "again.pt", env=env)
    assert again["diff"].get("num_inductor_compiles", 0) == 0, again["diff"]


def test_cache_written_before_v3_still_hits(
    built: tuple[Path, Path, int], cache: Path, run_py: PyRunner, tmp_path: Path
) -> None:
    """Every artifact re-encoded the way the previous main wrote it (v2,
    unsigned): a warm start from this (own) root compiles nothing."""
    for p in artifacts(cache):
        art = decode_artifact(p.read_bytes(), str(p), p.name)
        p.write_bytes(encode_artifact(art.payload, p.name))
        assert p.read_bytes().startswith(b"FXPIECE-ARTIFACT v2 digest=")
    r = warm(run_py, cache, tmp_path / "warm.pt")
    assert r["diff"].get("num_inductor_compiles", 0) == 0, r["diff"]
    assert r["diff"].get("num_corrupt_artifacts", 0) == 0
    assert r["diff"]["num_cache_hits"] > 0
    assert same_output(tmp_path / "warm.pt", built)
    assert not list((cache / "artifacts").glob("*/*.corrupt-*"))
    assert CacheLayout(cache).artifacts_dir.is_dir()
