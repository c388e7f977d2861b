"""``fxpiece cache push`` / ``pull`` between two cache roots through a real
``redis-server``, with a model compiled once: the pulled root warm-starts
with 0 Inductor compiles and equal outputs. (The store itself:
``tests/core/test_remote_store.py``.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PyRunner, run_toy, run_toy_subprocess
from programs.redis_server import RedisServer

from fxpiece.cache.admin import verify_cache
from fxpiece.cache.index import CacheIndex
from fxpiece.cache.layout import CacheLayout

_SCRIPT = shutil.which("fxpiece", path=str(Path(sys.executable).parent))
CLI = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "fxpiece"]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


TOY = {
    "layers": 1,
    "config": {
        "splitting_ops": ["fxpiece_toy::attention"],
        "compiler": "inductor",
        "max_num_tokens": 16,  # one range: 2 Inductor compiles
    },
    "sizes": [5, 12],
}


def fx(*args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, timeout=300, check=False
    )


def fx_json(*args: Any) -> Any:
    proc = fx(*args, "--json")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_push_pull_round_trip_warm_starts(
    redis_server: RedisServer, run_py: PyRunner, tmp_path: Path
) -> None:
    """Host A compiles and pushes; host B pulls into an empty root and starts
    with 0 compiles and equal outputs; pushing and pulling again changes nothing."""
    url = redis_server.url  # a server of this module's own: empty
    a, b = tmp_path / "a", tmp_path / "b"
    cold_spec = {**TOY, "config": {**TOY["config"], "cache_dir": str(a)}}
    cold = run_toy({**cold_spec, "out": str(tmp_path / "cold.pt")})  # in this process
    assert cold["diff"]["num_inductor_compiles"] > 0

    pushed = fx_json("cache", "push", a, url)
    assert pushed["ok"] and pushed["skipped"] == []
    assert pushed["models"] == 2  # the pieces' model and its ahead-of-time entry's
    assert pushed["blobs_pushed"] == len(list((a / "artifacts").glob("*/*")))
    assert pushed["entries_pushed"] > 0
    again = fx_json("cache", "push", a, url)
    assert again["blobs_pushed"] == again["entries_pushed"] == 0
    assert again["entries_present"] == pushed["entries_pushed"]

    pulled = fx_json("cache", "pull", b, url)
    assert pulled["ok"] and pulled["refused"] == []
    assert pulled["artifacts_written"] == pushed["blobs_pushed"]
    assert pulled["entries_written"] == pushed["entries_pushed"]
    assert verify_cache(b).ok
    # The same index, entry for entry (handles are relative to the root).
    folder = Path(cold["folder"]).relative_to(a)
    ia = CacheIndex(str(CacheLayout.index_dir(a / folder)), readonly=True).entries()
    ib = CacheIndex(str(CacheLayout.index_dir(b / folder)), readonly=True).entries()
    assert sorted(ia) == sorted(ib)

    warm_spec = {**TOY, "config": {**TOY["config"], "cache_dir": str(b)}}
    warm = run_toy_subprocess(run_py, {**warm_spec, "out": str(tmp_path / "warm.pt")})
    assert warm["key"] == cold["key"]
    assert warm["diff"].get("num_inductor_compiles", 0) == 0, warm["diff"]
    assert sum(warm["compiled"]) == 0 and sum(warm["loaded"]) > 0, warm
    c, w = torch.load(tmp_path / "cold.pt"), torch.load(tmp_path / "warm.pt")
    for n in TOY["sizes"]:
        torch.testing.assert_close(w[n], c[n], rtol=0, atol=0)

    repull = fx_json("cache", "pull", b, url)
    assert repull["artifacts_written"] == repull["entries_written"] == 0
    assert repull["entries_present"] == pushed["entries_pushed"]
