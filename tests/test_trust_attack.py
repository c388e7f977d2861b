"""The trust boundary under a real attack by another uid (``setpriv``).

A cache built by a real Inductor compile is left open the way operators get
it wrong (world-writable folders); user ``nobody`` plants code in it; the
owner's next warm start must never run that code: it refuses the folder
(UntrustedCacheError naming it and the fix) or loads nothing from it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import NOBODY, PyRunner, as_nobody, run_toy_subprocess

from fxpiece.cache.entries import KernelsKey, decode_key
from fxpiece.cache.index import CacheIndex
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.store import ArtifactStore, encode_artifact
from fxpiece.piecewise.kernels import KernelDir
from fxpiece.toy_llama import ATTENTION_OP

pytestmark = [
    pytest.mark.slow,  # real Inductor starts in fresh processes (~60 s)
    pytest.mark.skipif(
        os.getuid() != 0 or shutil.which("setpriv") is None,
        reason="needs root and setpriv to act as another uid",
    ),
]


def spec(cache: Path, out: Path | None = None, **config: Any) -> dict[str, Any]:
    return {
        "layers": 1,
        "config": {
            "splitting_ops": [ATTENTION_OP],
            "cache_dir": str(cache),
            "max_num_tokens": 32,
            **config,
        },
        "sizes": [5],
        "out": str(out) if out else None,
    }


@pytest.fixture(scope="module")
def built() -> Iterator[tuple[Path, Path, Path]]:
    """(base, cache, outputs of the cold run); base is reachable by nobody."""
    base = Path(tempfile.mkdtemp(prefix="fxpiece-attack-", dir="/tmp"))
    os.chmod(base, 0o755)
    cache = base / "cache"
    cold = run_toy_subprocess(PyRunner(), spec(cache, base / "cold.pt"))
    assert cold["diff"]["num_inductor_compiles"] > 0
    yield base, cache, base / "cold.pt"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def victim(built: tuple[Path, Path, Path], tmp_path: Path) -> Iterator[Path]:
    """A copy of the built cache in a folder of its own that nobody can traverse."""
    cache = built[1]
    where = Path(tempfile.mkdtemp(prefix="fxpiece-victim-", dir="/tmp"))
    os.chmod(where, 0o755)
    copy = where / "cache"
    shutil.copytree(cache, copy, symlinks=True)
    yield copy
    shutil.rmtree(where, ignore_errors=True)


def warm(run_py: PyRunner, cache: Path, out: Path, **config: Any) -> dict[str, Any]:
    result: dict[str, Any] = run_py.program(
        "run_toy_or_error", json.dumps(spec(cache, out, **config))
    )
    return result


def generated_modules(cache: Path) -> dict[str, bytes]:
    """The generated Python files of the cached kernel bundle (what the old
    design kept under <root>/inductor), by relative path."""
    (index,) = list(cache.glob("models/*/backbone/index"))
    kd = KernelDir()
    for key, value in CacheIndex(str(index), readonly=True).entries():
        if isinstance(decode_key(key), KernelsKey):
            payload = ArtifactStore(CacheLayout(cache), readonly=True).load(value["handle"])
            assert payload is not None
            kd.unpack(payload)
    return {rel: p.read_bytes() for rel, p in kd.files().items() if rel.endswith(".py")}


def test_code_planted_under_inductor_never_runs(
    built: tuple[Path, Path, Path], victim: Path, run_py: PyRunner, tmp_path: Path
) -> None:
    marker = Path("/tmp") / f"fxpiece-pwned-{os.getpid()}"
    marker.unlink(missing_ok=True)
    os.chmod(victim, 0o755)
    planted = victim / "inductor"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    modules = generated_modules(victim)
    assert modules, "the bundle holds Inductor's generated Python"
    line = f"\nopen({str(marker)!r}, 'w').write('pwned')\n".encode()
    plant = {rel: (src + line).decode() for rel, src in modules.items()}
    as_nobody(
        "import os, json\n"
        f"root = {str(planted)!r}\n"
        f"for rel, text in json.loads({json.dumps(json.dumps(plant))}).items():\n"
        "    p = os.path.join(root, rel)\n"
        "    os.makedirs(os.path.dirname(p), exist_ok=True)\n"
        "    open(p, 'w').write(text)\n"
    )
    assert all((planted / rel).stat().st_uid == NOBODY for rel in plant)
    r = warm(run_py, victim, tmp_path / "warm.pt")
    assert r["ok"], r
    assert r["diff"].get("num_inductor_compiles", 0) == 0 and r["diff"]["num_cache_hits"] > 0
    assert not marker.exists(), "code planted by another user ran"
    cold = torch.load(built[2])
    assert torch.equal(torch.load(tmp_path / "warm.pt")[5], cold[5])


def test_artifact_planted_in_a_writable_folder_is_refused(
    built: tuple[Path, Path, Path], victim: Path, run_py: PyRunner, tmp_path: Path
) -> None:
    (index,) = list(victim.glob("models/*/backbone/index"))
    piece = next(
        v for k, v in CacheIndex(str(index)).entries() if not isinstance(decode_key(k), KernelsKey)
    )
    target = victim / piece["handle"]["artifact"]
    shard = target.parent
    os.chmod(shard, 0o777)
    os.chmod(victim / "artifacts", 0o711)  # nobody may traverse, not list
    os.chmod(victim, 0o711)
    evil = encode_artifact(b"not what was compiled")
    as_nobody(
        f"import os\np = {str(target)!r}\nos.rename(p, p + '.old')\nopen(p, 'wb').write({evil!r})\n"
    )
    assert target.stat().st_uid == NOBODY
    r = warm(run_py, victim, tmp_path / "warm.pt")
    assert not r["ok"] and r["type"] == "UntrustedCacheError", r
    assert r["filename"] == str(shard) and "chmod go-w" in r["msg"], r
    # `fxpiece cache verify` reports the same paths the backend refuses.
    v = subprocess.run(
        [sys.executable, "-m", "fxpiece", "cache", "verify", str(victim)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert v.returncode == 1, v.stdout + v.stderr
    untrusted = [ln for ln in v.stdout.splitlines() if ln.startswith("UNTRUSTED")]
    assert any(str(shard) in ln for ln in untrusted), v.stdout
    assert any(str(target) in ln and "uid 65534" in ln for ln in untrusted), v.stdout
    # Overridden on purpose: the planted artifact fails its checksum and is recompiled.
    r = warm(run_py, victim, tmp_path / "warm.pt", allow_untrusted_cache=True)
    assert r["ok"], r
    assert r["diff"]["num_inductor_compiles"] >= 1 and r["diff"]["num_corrupt_artifacts"] >= 1
    assert torch.equal(torch.load(tmp_path / "warm.pt")[5], torch.load(built[2])[5])
    assert list(shard.glob(f"{target.name}.corrupt-*")), "the planted artifact was moved aside"
    # ...and the next start loads what was recompiled: nothing compiles.
    r = warm(run_py, victim, tmp_path / "warm.pt", allow_untrusted_cache=True)
    assert r["ok"] and r["diff"].get("num_inductor_compiles", 0) == 0, r


def test_symlink_in_place_of_a_folder_is_refused(
    victim: Path, run_py: PyRunner, tmp_path: Path
) -> None:
    shard = next(p for p in (victim / "artifacts").iterdir() if p.is_dir())
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(shard, elsewhere)
    shutil.chown(elsewhere, NOBODY, NOBODY)
    shutil.rmtree(shard)
    shard.symlink_to(elsewhere)
    r = warm(run_py, victim, tmp_path / "warm.pt")
    assert not r["ok"] and r["type"] == "UntrustedCacheError", r
    assert "symlink" in r["msg"] and r["filename"] == str(shard), r


def test_parent_anyone_can_write_is_refused(victim: Path, run_py: PyRunner, tmp_path: Path) -> None:
    parent = victim.parent
    os.chmod(parent, 0o777)  # no sticky bit: anyone could swap the cache root
    r = warm(run_py, victim, tmp_path / "warm.pt")
    assert not r["ok"] and r["type"] == "UntrustedCacheError", r
    assert r["filename"] == str(parent) and "sticky" in r["msg"], r
    os.chmod(parent, 0o1777)  # like /tmp: fine
    r = warm(run_py, victim, tmp_path / "warm.pt")
    assert r["ok"] and r["diff"].get("num_inductor_compiles", 0) == 0, r
