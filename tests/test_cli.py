"""The ``fxpiece`` command: every ``cache`` subcommand through the real
console script, in a subprocess, on a cache made by a real compile.

One module-wide build compiles the toy Llama (1 layer, split at attention,
ranges [1,8] [9,64]) with Inductor, plus two eager keys that differ only in
``compile_sizes``; each test works on its own copy of that cache folder.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fxpiece.cache.admin import ArchiveError, list_cache, unpack_cache, verify_cache
from fxpiece.cache.lease import Lease

# A module-wide Inductor build in a fresh process, then many CLI runs (~80 s).
pytestmark = pytest.mark.slow

_SCRIPT = shutil.which("fxpiece", path=str(Path(sys.executable).parent))
CLI = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "fxpiece"]

SPLIT = "fxpiece_toy::attention"
INDUCTOR = {
    "splitting_ops": [SPLIT],
    "compiler": "inductor",
    "max_num_tokens": 64,
    "compile_ranges_endpoints": [8],
    "aot": False,  # the counts below are of piece artifacts (test_aot covers .aot entries)
}
EAGER = {**INDUCTOR, "compiler": "eager"}
SIZES = [5, 12]  # one token count per range


def run_models(run_py: Any, root: Path, configs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    spec = {"configs": [{**c, "cache_dir": str(root)} for c in configs], "sizes": SIZES}
    result: list[dict[str, Any]] = run_py.program("toy_configs", json.dumps(spec))
    return result


def fx(*args: Any) -> subprocess.CompletedProcess[str]:
    """Run the console script."""
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, timeout=300, check=False
    )


def fx_ok(*args: Any, rc: int = 0) -> subprocess.CompletedProcess[str]:
    proc = fx(*args)
    assert proc.returncode == rc, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def fx_json(*args: Any, rc: int = 0) -> Any:
    return json.loads(fx_ok(*args, "--json", rc=rc).stdout)


@dataclass(frozen=True)
class Built:
    root: Path
    inductor: dict[str, Any]
    eager: dict[str, Any]
    eager16: dict[str, Any]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, run_py: Any) -> Built:
    root = tmp_path_factory.mktemp("cli-build") / "cache"
    ind, eager, eager16 = run_models(
        run_py, root, [INDUCTOR, EAGER, {**EAGER, "compile_sizes": [16]}]
    )
    assert ind["diff"]["num_inductor_compiles"] == 4, ind
    assert ind["err"] < 1e-4
    return Built(root, ind, eager, eager16)


@pytest.fixture
def cache(built: Built, tmp_path: Path) -> Path:
    """A private copy of the built cache."""
    dst = tmp_path / "cache"
    shutil.copytree(built.root, dst, symlinks=True)
    return dst


def bundles(root: Path) -> list[Path]:
    """The kernel bundles (Inductor's compiled kernels: per piece entry and per model)."""
    return sorted(
        {
            root / k.artifact
            for m in list_cache(root).models
            for k in m.kernels
            if k.artifact is not None
        }
    )


def artifacts(root: Path) -> list[Path]:
    """The pieces' artifacts (not the kernel bundles)."""
    skip = set(bundles(root))
    return sorted(
        p for p in (root / "artifacts").glob("*/*") if "." not in p.name and p not in skip
    )


def model_folder(root: Path, key: str) -> Path:
    return root / "models" / key[:32] / "backbone"


# -- ls -------------------------------------------------------------------------


def test_ls_lists_models_and_entries(cache: Path, built: Built) -> None:
    out = fx_ok("cache", "ls", cache).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith(built.inductor["key"][:12]))
    assert "backbone" in line and "inductor" in line and "[1,8] [9,64]" in line

    data = fx_json("cache", "ls", cache)
    models = {m["key"]: m for m in data["models"]}
    assert set(models) == {built.inductor["key"], built.eager["key"], built.eager16["key"]}
    m = models[built.inductor["key"]]
    assert (m["tag"], m["num_entries"], m["pieces"]) == ("backbone", 4, [0, 2])
    assert m["ranges"] == ["[1,8]", "[9,64]"] and m["compilers"] == ["inductor"]
    on_disk = sum(p.stat().st_size for p in artifacts(cache) + bundles(cache))
    assert m["artifact_bytes"] == data["total_artifact_bytes"] == on_disk > 0
    assert m["last_use"] is not None and data["orphans"] == []
    assert models[built.eager16["key"]]["ranges"] == ["[1,8]", "[9,64]", "[16,16]"]


# -- explain ------------------------------------------------------------------


def test_explain_names_exactly_the_changed_factor(
    cache: Path, built: Built, tmp_path: Path
) -> None:
    a, b = built.eager["key"], built.eager16["key"]
    data = fx_json("cache", "explain", a[:12], b[:12], "--root", cache)
    assert data["groups"] == ["config"] and data["files"] == []
    assert [(c["group"], c["name"]) for c in data["changes"]] == [("config", "compile_entries")]
    assert data["changes"][0]["new"] == [[1, 8], [9, 64], [16, 16]]
    assert (data["a"]["key"], data["b"]["key"]) == (a, b)

    # Two folders, human output: the one-line answer.
    out = fx_ok("cache", "explain", model_folder(cache, a), model_folder(cache, b)).stdout
    assert out.splitlines()[2] == (
        "config.compile_entries: [[1, 8], [9, 64]] -> [[1, 8], [9, 64], [16, 16]]"
    )

    # A traced file that changed (a copy of the factors with one digest edited).
    src = model_folder(cache, built.inductor["key"])
    edited = tmp_path / "edited"
    edited.mkdir()
    factors = json.loads((src / "cache_key_factors.json").read_text())
    path = next(p for p in sorted(factors["code"]["files"]) if p.endswith("toy_llama.py"))
    old = factors["code"]["files"][path]
    factors["code"]["files"][path] = "cd34" * 16
    factors["code"]["digest"] = "ef56" * 16
    (edited / "cache_key_factors.json").write_text(json.dumps(factors))
    data = fx_json("cache", "explain", src, edited)
    assert data["groups"] == ["code"] and data["changes"] == []
    assert data["files"] == [{"path": path, "kind": "changed", "old": old, "new": "cd34" * 16}]
    assert data["summary"] == f"1 traced file changed: {path} ({old[:8]}.. -> cd34cd34..)"


# -- verify -------------------------------------------------------------------


def test_verify_clean_cache(cache: Path) -> None:
    out = fx_ok("cache", "verify", cache).stdout
    assert "4 artifact(s)" in out and out.rstrip().endswith("OK")


def test_verify_repair_quarantines_and_next_run_recompiles(
    cache: Path, built: Built, run_py: Any
) -> None:
    arts = artifacts(cache)
    assert len(arts) == 4
    flipped, truncated, empty, good = arts
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    with open(truncated, "r+b") as f:
        f.truncate(truncated.stat().st_size // 2)
    empty.write_bytes(b"")
    bad = {str(p.relative_to(cache)): p.read_bytes() for p in (flipped, truncated, empty)}

    # Without --repair: reported (exit 1), nothing on disk changes.
    report = fx_json("cache", "verify", cache, rc=1)
    assert not report["ok"] and sorted(p["artifact"] for p in report["problems"]) == sorted(bad)
    reasons = {p["artifact"]: p["reason"] for p in report["problems"]}
    assert "checksum mismatch" in reasons[str(flipped.relative_to(cache))]
    assert "truncated" in reasons[str(truncated.relative_to(cache))]
    assert "empty" in reasons[str(empty.relative_to(cache))]
    assert all((cache / rel).read_bytes() == content for rel, content in bad.items())

    # --repair: moved aside (never deleted), their entries removed; exit 1 the first time.
    out = fx_ok("cache", "verify", cache, "--repair", rc=1).stdout
    assert "3 problem(s) repaired" in out
    for rel, content in bad.items():
        assert not (cache / rel).exists()
        (aside,) = (cache / rel).parent.glob(f"{Path(rel).name}.corrupt-*")
        assert aside.read_bytes() == content
    assert good.exists()
    assert verify_cache(cache).ok  # in-process: clean now, nothing left to repair

    # The next run recompiles exactly those three, loads the fourth, matches eager.
    (rerun,) = run_models(run_py, cache, [INDUCTOR])
    assert rerun["key"] == built.inductor["key"]
    assert rerun["diff"]["num_inductor_compiles"] == 3, rerun["diff"]
    assert rerun["diff"]["num_cache_hits"] == 1, rerun["diff"]
    assert rerun["err"] < 1e-4
    after = verify_cache(cache)
    assert after.ok and after.artifacts_checked == 4


# -- prune --------------------------------------------------------------------


def test_prune_lru_respects_size_and_live_leases(cache: Path, built: Built) -> None:
    arts = artifacts(cache)
    now = time.time()
    for i, p in enumerate(arts):  # arts[0] least recently used ... arts[3] most
        os.utime(p, (now - (len(arts) - i) * 3600, now - (len(arts) - i) * 3600))
    sizes = [p.stat().st_size for p in arts]
    kernels = bundles(cache)  # unpacked by every warm start: the most recently used
    for bundle in kernels:
        os.utime(bundle, (now, now))
    locks = cache / "locks"
    locks.mkdir(exist_ok=True)
    lease = Lease.try_acquire(str(locks / f"{arts[0].name}.lease"))
    assert lease is not None
    try:
        limit = sizes[0] + sizes[3] + sum(b.stat().st_size for b in kernels)
        res = fx_json("cache", "prune", cache, "--max-size", limit)
    finally:
        lease.release()
    rel = [str(p.relative_to(cache)) for p in arts]
    # The oldest is in use (lease held): kept; the next two go; then it fits.
    assert [r["artifact"] for r in res["removed"]] == rel[1:3]
    assert [k["artifact"] for k in res["kept"]] == [rel[0]]
    assert "lease" in res["kept"][0]["reason"]
    assert res["bytes_after"] == limit and res["size_target_met"]
    assert [p.exists() for p in arts] == [True, False, False, True]
    listing = list_cache(cache)
    (m,) = [m for m in listing.models if m.key == built.inductor["key"]]
    assert sorted(e.artifact or "" for e in m.entries) == [rel[0], rel[3]]

    # --older-than, human output; a temp file being written is never touched.
    old = now - 10 * 86400
    os.utime(arts[0], (old, old))
    temp = arts[0].parent / ".tmp-otherhost-1-00000000deadbeef"
    temp.write_bytes(b"partial")
    os.utime(temp, (old, old))
    out = fx_ok("cache", "prune", cache, "--older-than", "7d").stdout
    assert "removed 1 artifact(s)" in out
    assert not arts[0].exists() and arts[3].exists() and temp.exists()


# -- pack / unpack ----------------------------------------------------------


def test_pack_unpack_warm_start_compiles_nothing(
    cache: Path, built: Built, run_py: Any, tmp_path: Path
) -> None:
    archive = tmp_path / "out" / "cache.tar.gz"
    (cache / "locks").mkdir(exist_ok=True)
    (cache / "locks" / "stray.lease").write_text("{}")
    fx_ok("cache", "pack", cache, "-o", archive)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())
    assert names[0] == "manifest.json"
    assert manifest["format"] == "fxpiece-cache" and manifest["version"] == 1
    assert sorted(f["path"] for f in manifest["files"]) == sorted(names[1:])
    assert all(not n.startswith(("/", "locks", "inductor")) and ".." not in n for n in names)
    assert {f["path"] for f in manifest["files"]} >= {
        str(p.relative_to(cache)) for p in artifacts(cache)
    }

    other = tmp_path / "elsewhere" / "cache"
    fx_ok("cache", "unpack", archive, other)
    for d in [other, *(p for p in other.rglob("*") if p.is_dir())]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert not (other / "inductor").exists()

    (warm,) = run_models(run_py, other, [INDUCTOR])
    assert warm["key"] == built.inductor["key"]
    assert warm["diff"].get("num_inductor_compiles", 0) == 0, warm["diff"]
    assert warm["diff"]["num_cache_hits"] == 4 and warm["err"] < 1e-4
    assert warm["folder"].startswith(str(other))


def _tar(path: Path, members: Sequence[tuple[str, bytes]], listed: bool = True) -> None:
    files = [{"path": n, "size": len(d), "blake3": "0" * 64} for n, d in members]
    manifest = json.dumps({"format": "fxpiece-cache", "version": 1, "files": files}).encode()
    with tarfile.open(path, "w:gz") as tar:
        for name, data in [("manifest.json", manifest), *members]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_unpack_refuses_path_traversal(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    _tar(evil, [("../evil", b"owned")])
    root = tmp_path / "deep" / "root"
    proc = fx_ok("cache", "unpack", evil, root, rc=1)
    assert "refusing" in proc.stderr and "../evil" in proc.stderr
    assert not (tmp_path / "deep" / "evil").exists() and not (tmp_path / "evil").exists()
    assert not root.exists()


@pytest.mark.parametrize(
    "name",
    ["../evil", "artifacts/../../evil", "/tmp/evil", "artifacts/./x", "locks/x", "artifacts"],
)
def test_unpack_refuses_unsafe_names(tmp_path: Path, name: str) -> None:
    evil = tmp_path / "evil.tar"
    _tar(evil, [(name, b"x")])
    with pytest.raises(ArchiveError, match="refusing"):
        unpack_cache(evil, tmp_path / "root")
    assert not (tmp_path / "root").exists()


def test_unpack_refuses_links_and_bad_checksums(tmp_path: Path) -> None:
    link = tmp_path / "link.tar"
    with tarfile.open(link, "w") as tar:
        body = json.dumps({"format": "fxpiece-cache", "version": 1, "files": []}).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
        sym = tarfile.TarInfo("artifacts/aa/x")
        sym.type = tarfile.SYMTYPE
        sym.linkname = "/etc/passwd"
        tar.addfile(sym)
    with pytest.raises(ArchiveError, match="link"):
        unpack_cache(link, tmp_path / "root")
    bad = tmp_path / "bad.tar"
    _tar(bad, [("artifacts/aa/" + "a" * 64, b"not what the manifest says")])
    with pytest.raises(ArchiveError, match="checksum"):
        unpack_cache(bad, tmp_path / "root2")
    assert not list((tmp_path / "root2").rglob("*"))


# -- errors -------------------------------------------------------------------


def test_errors_are_messages_with_exit_codes(tmp_path: Path) -> None:
    proc = fx_ok("cache", "verify", tmp_path / "nope", rc=1)
    assert proc.stderr.startswith("fxpiece: error: no fxpiece cache at")
    from fxpiece.cli import main

    for argv in (["cache", "prune", str(tmp_path)], ["cache", "prune", "--max-size", "10X"], []):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2


def test_bench_hash_on_given_files(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"m{i}.py").write_text(f"x = {i}\n" * 100)
    p = subprocess.run(
        [sys.executable, "-m", "fxpiece", "bench", "hash", str(tmp_path), "--runs", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["files"] == 5 and out["bytes"] == sum(
        f.stat().st_size for f in tmp_path.glob("*.py")
    )
    assert out["reference_over_fxpiece"] > 0 and out["fxpiece_over_floor"] > 0
    human = subprocess.run(
        [sys.executable, "-m", "fxpiece", "bench", "hash", str(tmp_path), "--runs", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert human.returncode == 0 and "reference / fxpiece" in human.stdout
