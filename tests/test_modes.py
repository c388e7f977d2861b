"""Read-only cache (a read-only mount) and require_cache_hit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, fxpiece
    from fxpiece.toy_llama import ToyLlama, ToyLlamaConfig
    cache, layers, extra = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    m = ToyLlama(ToyLlamaConfig(num_layers=layers)).eval()
    cfg = fxpiece.CompileConfig.from_env(
        splitting_ops=["fxpiece_toy::attention"], max_num_tokens=64, cache_dir=cache,
        compiler="inductor", **extra)
    cm = fxpiece.compile(m, cfg)
    try:
        with torch.no_grad():
            ok = torch.allclose(cm(torch.arange(5)), m(torch.arange(5)), atol=1e-4)
        print(json.dumps({"ok": bool(ok), **fxpiece.counters.snapshot()}))
    except fxpiece.CacheError as e:
        print(json.dumps({"error": type(e).__name__, "msg": str(e)}))
    """
)


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
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("modes")
    script = d / "run.py"
    script.write_text(SCRIPT)
    cache = d / "cache"
    out = _run(script, cache, 1, {})
    assert out["ok"] and out["num_inductor_compiles"] == 2
    return script, cache


def _run(
    script: Path, cache: Path, layers: int, extra: dict[str, object], readonly_mount: bool = False
) -> dict[str, object]:
    cmd = [sys.executable, str(script), str(cache), str(layers), json.dumps(extra)]
    if readonly_mount:
        cmd = _readonly_mount(str(cache), " ".join(f"'{c}'" for c in cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    result: dict[str, object] = json.loads(p.stdout.strip().splitlines()[-1])
    result["stderr"] = p.stderr
    return result


@pytest.mark.skipif(not _can_mount_readonly(), reason="cannot make a read-only bind mount here")
def test_readonly_mount_loads_hits_and_compiles_misses_in_memory(built: tuple[Path, Path]) -> None:
    script, cache = built
    before = _files(cache)
    hit = _run(script, cache, 1, {"cache_readonly": True}, readonly_mount=True)
    assert hit["ok"] and hit["num_inductor_compiles"] == 0 and hit["num_cache_hits"] == 2
    miss = _run(script, cache, 2, {"cache_readonly": True}, readonly_mount=True)
    # A new key; its first and last pieces are the 1-layer model's (same
    # digest, loaded from its artifacts); only the middle one compiles.
    assert miss["ok"] and miss["num_inductor_compiles"] == 1 and miss["num_cache_hits"] == 2
    assert miss["num_compiled_artifacts_saved"] == 0 and miss["num_cache_entries_updated"] == 0
    assert _files(cache) == before, "nothing written, touched or removed"


def test_readonly_flag_writes_nothing(built: tuple[Path, Path], tmp_path: Path) -> None:
    script, cache = built
    copy = tmp_path / "copy"
    shutil.copytree(cache, copy)
    before = _files(copy)
    miss = _run(script, copy, 2, {"cache_readonly": True})
    assert miss["ok"] and miss["num_inductor_compiles"] == 1 and miss["num_cache_hits"] == 2
    # Nothing at all is written, touched or moved under the root, though it
    # is writable: Inductor works in a private temporary folder.
    assert _files(copy) == before
    assert not (copy / "inductor").exists()


def test_require_cache_hit_names_the_differing_factor(built: tuple[Path, Path]) -> None:
    script, cache = built
    ok = _run(script, cache, 1, {"require_cache_hit": True})
    assert ok["ok"] and ok["num_inductor_compiles"] == 0
    miss = _run(script, cache, 1, {"require_cache_hit": True, "compile_sizes": [4]})
    assert miss["error"] == "CacheMissError"
    assert "compile_entries" in str(miss["msg"]), miss["msg"]
    # The backend also logged the explanation once.
    assert "nearest cached key" in str(miss["stderr"])
