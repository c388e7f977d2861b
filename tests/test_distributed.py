"""fxpiece.distributed: ranks without a shared cache compile each piece once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from programs.run import program_argv, program_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_job(tmp_path: Path, world: int, compiler: str) -> list[dict[str, int]]:
    port = _free_port()
    procs = []
    for r in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(r),
            "WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": "1",
        }
        # Files, not pipes: a rank blocked on a full pipe would stall the
        # other ranks in a collective.
        logs = (tmp_path / f"rank{r}.out", tmp_path / f"rank{r}.err")
        with logs[0].open("w") as o, logs[1].open("w") as e:
            proc = subprocess.Popen(
                program_argv("dist_rank", tmp_path / "caches", compiler),
                stdout=o,
                stderr=e,
                env=program_env(env),
            )
        procs.append((proc, logs))
    out = []
    for p, (o, e) in procs:
        try:
            p.wait(timeout=300)
        finally:
            for q, _ in procs:
                if q.poll() is None and p.returncode is None:
                    q.kill()
        assert p.returncode == 0, e.read_text()[-3000:]
        out.append(json.loads(o.read_text().strip().splitlines()[-1]))
    return out


@pytest.mark.slow
def test_each_unique_piece_compiled_by_one_rank_then_all_warm(tmp_path: Path) -> None:
    world = 2
    # 1 layer: 2 distinct compiled pieces x 2 ranges = 4 unique digests.
    cold = _run_job(tmp_path, world, "inductor")
    assert all(r["ok"] for r in cold)
    assert sum(r["num_inductor_compiles"] for r in cold) == 4
    assert all(r["num_inductor_compiles"] == 2 for r in cold), "work is spread over ranks"
    # Each rank received what the other compiled and loaded everything.
    assert all(r["shared_in"] == 2 for r in cold)
    assert all(r["num_cache_hits"] == 4 for r in cold)
    # ... with the kernels their compiles built: loading them rebuilt none
    # (nothing new was left to store in a model-level bundle).
    assert all(r["kernels_in"] >= 1 for r in cold), cold
    assert not any(r["model_bundle"] for r in cold), cold
    for r in range(world):
        assert list((tmp_path / "caches" / f"rank{r}" / "artifacts").rglob("*"))
    warm = _run_job(tmp_path, world, "inductor")
    assert all(r["ok"] for r in warm)
    assert sum(r["num_inductor_compiles"] for r in warm) == 0
    assert all(r["shared_in"] == 0 and r["num_cache_hits"] == 4 for r in warm)


@pytest.mark.slow
def test_eager_handles_are_shared_too(tmp_path: Path) -> None:
    cold = _run_job(tmp_path, 2, "eager")
    assert all(r["ok"] for r in cold)
    assert sum(r["num_eager_compiles"] for r in cold) == 4
    assert all(r["num_aot_saves"] == 0 for r in cold), "no ahead-of-time start across ranks"
    warm = _run_job(tmp_path, 2, "eager")
    assert sum(r["num_eager_compiles"] for r in warm) == 0
