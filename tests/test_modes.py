"""Read-only cache (a read-only mount) and require_cache_hit."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from programs.report import RESULT_MARK
from programs.run import program_argv, program_env

# Inductor starts in fresh processes, some in a read-only mount (~110 s).
pytestmark = pytest.mark.slow


def _files(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*")}


def _readonly_mount(folder: str, then: str, setup: str = "") -> list[str]:
    """A command running ``then`` in a private mount namespace where
    ``folder`` is bind-mounted read-only."""
    return [
        "unshare",
        "--user",
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        f"{setup}mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && {then}",
    ]


def _can_mount_readonly() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(
        _readonly_mount("$d", "! touch $d/x", setup="d=$(mktemp -d) && "),
        capture_output=True,
    )
    return r.returncode == 0


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("modes") / "cache"
    out = _run(cache, 1, {})
    assert out["ok"] and out["num_inductor_compiles"] == 2
    return cache


def _run(
    cache: Path, layers: int, extra: dict[str, object], readonly_mount: bool = False
) -> dict[str, object]:
    """``programs.toy_from_env`` in a fresh process (in a read-only mount of
    ``cache`` if asked); its report and its stderr."""
    cmd = program_argv("toy_from_env", cache, layers, json.dumps(extra))
    if readonly_mount:
        cmd = _readonly_mount(str(cache), " ".join(f"'{c}'" for c in cmd))
    p = subprocess.run(cmd, env=program_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT_MARK)][-1:]
    result: dict[str, object] = json.loads(line[len(RESULT_MARK) :])
    result["stderr"] = p.stderr
    return result


@pytest.mark.skipif(not _can_mount_readonly(), reason="cannot make a read-only bind mount here")
def test_readonly_mount_loads_hits_and_compiles_misses_in_memory(built: Path) -> None:
    cache = built
    before = _files(cache)
    hit = _run(cache, 1, {"cache_readonly": True}, readonly_mount=True)
    assert hit["ok"] and hit["num_inductor_compiles"] == 0 and hit["num_cache_hits"] == 2
    miss = _run(cache, 2, {"cache_readonly": True}, readonly_mount=True)
    # A new key; its first and last pieces are the 1-layer model's (same
    # digest, loaded from its artifacts); only the middle one compiles.
    assert miss["ok"] and miss["num_inductor_compiles"] == 1 and miss["num_cache_hits"] == 2
    assert miss["num_compiled_artifacts_saved"] == 0 and miss["num_cache_entries_updated"] == 0
    assert _files(cache) == before, "nothing written, touched or removed"


def test_readonly_flag_writes_nothing(built: Path, tmp_path: Path) -> None:
    cache = built
    copy = tmp_path / "copy"
    shutil.copytree(cache, copy)
    before = _files(copy)
    miss = _run(copy, 2, {"cache_readonly": True})
    assert miss["ok"] and miss["num_inductor_compiles"] == 1 and miss["num_cache_hits"] == 2
    # Nothing at all is written, touched or moved under the root, though it
    # is writable: Inductor works in a private temporary folder.
    assert _files(copy) == before
    assert not (copy / "inductor").exists()


def test_require_cache_hit_names_the_differing_factor(built: Path) -> None:
    cache = built
    ok = _run(cache, 1, {"require_cache_hit": True})
    assert ok["ok"] and ok["num_inductor_compiles"] == 0
    miss = _run(cache, 1, {"require_cache_hit": True, "compile_sizes": [4]})
    assert miss["error"] == "CacheMissError"
    assert "compile_entries" in str(miss["msg"]), miss["msg"]
    # The backend also logged the explanation once.
    assert "nearest cached key" in str(miss["stderr"])
