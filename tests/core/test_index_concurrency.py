"""Many processes on one index: concurrent writers (with and without flock), and
writers killed with SIGKILL at random moments."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import time
import warnings

import pytest
from programs.run import program_argv, program_env

from fxpiece import CacheIndex, verify_index

N_WRITERS = 16
N_KEYS = 200
N_SHARED = 8


def _spawn(program: str, *args: object) -> subprocess.Popen[str]:
    """Start ``tests/programs/<program>.py`` (it imports only the native module)."""
    return subprocess.Popen(
        program_argv(program, *args),
        env=program_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_ready(p: subprocess.Popen[str]) -> None:
    assert p.stdout is not None and p.stdin is not None
    line = p.stdout.readline()
    if line.strip() != "ready":
        p.kill()
        _, err = p.communicate(timeout=30)
        pytest.fail(f"child failed to start: {line!r} {err}")


def _go(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.write("go\n")
    p.stdin.flush()


@pytest.mark.parametrize("use_flock", [True, False], ids=["flock", "no-flock-distinct-hosts"])
def test_many_processes_insert_concurrently(tmp_path: pathlib.Path, use_flock: bool) -> None:
    path = tmp_path / "index"
    stop = tmp_path / "stop"
    flag = int(use_flock)
    writers = [
        _spawn("index_writer", path, wid, flag, N_KEYS, N_SHARED, 8) for wid in range(N_WRITERS)
    ]
    readers = [_spawn("index_reader", path, stop, flag) for _ in range(2)]
    try:
        for p in writers + readers:
            _wait_ready(p)
        for p in writers + readers:
            _go(p)
        results = []
        for wid, p in enumerate(writers):
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, f"writer {wid} failed:\n{err}"
            assert err.strip() == "", f"writer {wid} wrote to stderr:\n{err}"
            results.append(json.loads(out.strip().splitlines()[-1]))
        stop.touch()
        for p in readers:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, f"reader failed:\n{err}"
            stats = json.loads(out.strip().splitlines()[-1])
            assert stats["refreshes"] > 0
    finally:
        for p in writers + readers:
            if p.poll() is None:
                p.kill()
                p.wait()

    report = verify_index(path)
    assert report.ok, report.problems
    assert not [n for n in os.listdir(path) if n.startswith(".tmp-")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        idx = CacheIndex(path)
    entries = dict(idx.entries())
    for wid in range(N_WRITERS):
        for i in range(N_KEYS):
            assert entries.get((wid, i, 0, "own")) == {"w": wid, "i": i}, (wid, i)
    own = [k for k in entries if k[3] == "own"]
    assert len(own) == N_WRITERS * N_KEYS

    # Shared keys: last writer wins, and the winner is some writer's *last*
    # write of that key (one handle's stamps only grow).
    for s in range(N_SHARED):
        writers_of_s = {w: r["last_shared"].get(str(s)) for w, r in enumerate(results)}
        writers_of_s = {w: q for w, q in writers_of_s.items() if q is not None}
        val = entries.get((-1, s, 0, "shared"))
        if not writers_of_s:
            assert val is None
            continue
        assert val is not None, s
        assert writers_of_s.get(val["w"]) == val["seq"], (s, val, writers_of_s)
    assert sum(r["commits"] for r in results) > N_WRITERS * 30
    assert sum(r["compactions"] for r in results) >= 10

    # Every handle converges on the same state; compaction keeps it.
    assert idx.compact(timeout=30) is True
    assert dict(CacheIndex(path).entries()) == entries


# ----- crash test ------------------------------------------------------------------

PER_ROUND = 6
ROUNDS = 10  # 60 kills


def test_sigkilled_writers_never_lose_a_returned_commit(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "index"
    CacheIndex(path)  # create the folder
    rng = random.Random(1234)
    committed: set[tuple[int, int, int, str]] = set()
    kills = 0
    wid = 0

    def batch() -> list[tuple[int, subprocess.Popen[str]]]:
        nonlocal wid
        out = []
        for _ in range(PER_ROUND):
            out.append((wid, _spawn("index_crash_writer", path, wid, rng.choice([2, 4, 8, 64]))))
            wid += 1
        return out

    pending = batch()
    t_start = time.monotonic()
    try:
        for round_ in range(ROUNDS):
            current = pending
            for _, p in current:
                _wait_ready(p)
            # Warm up the next round's interpreters while this one runs.
            pending = batch() if round_ + 1 < ROUNDS else []
            for _, p in current:
                _go(p)
            t0 = time.monotonic()
            for delay, (_, p) in sorted(
                ((rng.uniform(0.0, 0.15), wp) for wp in current), key=lambda x: x[0]
            ):
                time.sleep(max(0.0, t0 + delay - time.monotonic()))
                p.send_signal(signal.SIGKILL)
            for w, p in current:
                out, err = p.communicate(timeout=60)
                assert p.returncode == -signal.SIGKILL, f"writer {w} ended on its own:\n{err}"
                kills += 1
                for line in out.splitlines():
                    if line == "ready":
                        continue
                    committed.update((w, int(i), 0, "crash") for i in line.split())
            # After every round: the index verifies and holds every returned commit.
            report = verify_index(path)
            assert report.ok, report.problems
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                idx = CacheIndex(path)
            missing = committed - set(idx.keys())
            assert not missing, f"round {round_}: lost {len(missing)}: {sorted(missing)[:5]}"
            for k in list(committed)[:50]:
                assert idx.get(k) == {"w": k[0], "i": k[1]}
    finally:
        for _, p in pending:
            p.kill()
            p.wait()

    assert kills >= 50
    assert len(committed) > 0
    # Temp files of the killed writers (same host, dead pids) are removed by
    # the next handle that lists the folder.
    idx = CacheIndex(path)
    idx.refresh()
    left = [n for n in os.listdir(path) if n.startswith(".tmp-")]
    assert left == [], left
    assert idx.compact(timeout=30) is True
    assert committed <= set(CacheIndex(path).keys())
    assert verify_index(path).ok
    assert time.monotonic() - t_start < 120
