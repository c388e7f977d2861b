"""Multi-process startup: identical pieces compile once, single-flight leases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from programs.run import program_argv, program_env

import fxpiece
from fxpiece.cache.lease import Lease, namespace_id, read_lease
from fxpiece.toy_llama import ATTENTION_OP, ToyLlama, ToyLlamaConfig


def _spawn(
    tmp_path: Path, cache: Path, compiler: str, layers: int, **env: str
) -> subprocess.Popen[str]:
    """Start one rank (tests/programs/rank.py)."""
    return subprocess.Popen(
        program_argv("rank", cache, compiler, layers),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=program_env(env),
    )


def _wait_for(
    what: str, done: Callable[[], bool], procs: list[subprocess.Popen[str]], timeout: float = 240
) -> None:
    """Wait until ``done()`` (an event a rank signals), failing early if one
    of ``procs`` exits first."""
    t_end = time.monotonic() + timeout
    while not done():
        for p in procs:
            if p.poll() is not None:
                _, err = p.communicate()
                raise AssertionError(f"a rank exited (rc={p.returncode}) before {what}:\n{err}")
        assert time.monotonic() < t_end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _marked(mark: Path) -> list[Path]:
    """The leases and slots a rank started with ``WAIT_MARK=mark`` found taken."""
    lines = mark.read_text().splitlines() if mark.exists() else []
    return [Path(line).resolve() for line in lines]


def _start_together(
    tmp_path: Path, n: int, cache: Path, compiler: str, layers: int, **env: str
) -> list[subprocess.Popen[str]]:
    """``n`` ranks, released at once when all of them are ready."""
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(n)]
    procs = [
        _spawn(tmp_path, cache, compiler, layers, GO_FILE=str(go), READY_FILE=str(r), **env)
        for r in ready
    ]
    _wait_for("every rank is ready", lambda: all(r.exists() for r in ready), procs)
    go.touch()
    return procs


def _result(p: subprocess.Popen[str], timeout: float = 240) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _overlaps(intervals: list[list[float]]) -> int:
    """The most intervals open at one instant."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most = cur = 0
    for _, step in events:
        cur += step
        most = max(most, cur)
    return most


@pytest.mark.parametrize("slots", [1, 2])
@pytest.mark.slow
def test_compile_slots_bound_concurrent_compiles_across_processes(
    tmp_path: Path, slots: int
) -> None:
    # 1 layer split at attention, ranges [1,8] [9,64]: 2 pieces x 2 ranges =
    # 4 unique digests; each compile sleeps 3 s. Four processes steal work.
    cache = tmp_path / "cache"
    env = {"SLOW_COMPILE": "3", "ENDPOINTS": "8", "SLOTS": str(slots)}
    procs = _start_together(tmp_path, 4, cache, "slow-eager", 1, **env)
    results = [_result(p) for p in procs]
    assert all(r["ok"] for r in results)
    assert sum(r["num_eager_compiles"] for r in results) == 4, "each unique piece once"
    intervals = [iv for r in results for iv in r["intervals"]]
    assert len(intervals) == 4
    if slots == 1:
        assert _overlaps(intervals) == 1, sorted(intervals)
    else:
        assert _overlaps(intervals) == 2, sorted(intervals)
        assert sum(1 for r in results if r["num_eager_compiles"]) >= 2, "work was stolen"
    assert not list((cache / "locks").glob("**/*.lease")), "slots and leases are released"


@pytest.mark.slow
def test_killed_slot_holder_does_not_block_others(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    holder = _spawn(tmp_path, cache, "slow-eager", 1, SLOW_COMPILE="120", SLOTS="1")
    assert holder.stdout is not None
    line = holder.stdout.readline()
    assert line.strip() == "compiling", holder.stderr.read() if holder.stderr else ""
    (slot,) = (cache / "locks" / "slots").glob("*/slot-0.lease")
    # Other digests (another Inductor option: every piece differs): it waits
    # for the slot only, not for a piece's lease.
    mark = tmp_path / "waits"
    waiter = _spawn(tmp_path, cache, "slow-eager", 1, SLOTS="1", SALT="1", WAIT_MARK=str(mark))
    _wait_for(
        "the waiter finds the slot taken", lambda: slot.resolve() in _marked(mark), [waiter, holder]
    )
    time.sleep(1.5)  # not a synchronisation: the wait the waiter then reports
    assert waiter.poll() is None, "the waiter waits for the only slot"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    r = _result(waiter, timeout=120)
    assert r["ok"] and r["num_eager_compiles"] == 2
    assert r["slot_wait_s"] >= 1.0 and r["num_cache_waits"] == 0, r
    assert not slot.exists()


@pytest.mark.slow
def test_identical_layers_compile_once_per_entry() -> None:
    m = ToyLlama(ToyLlamaConfig(num_layers=4)).eval()
    cfg = fxpiece.CompileConfig(
        splitting_ops=[ATTENTION_OP],
        compile_ranges_endpoints=[8],
        max_num_tokens=64,
        compile_sizes=[4],
        compiler="inductor",
        disable_cache=True,
    )
    entries = len(cfg.compile_entries)
    cm = fxpiece.compile(m, cfg)
    # 9 pieces, 5 compiled: first, 3 identical middles, last -> 3 distinct.
    with (
        fxpiece.counters.expect(
            num_piecewise_capturable_graphs_seen=5,
            num_backend_compilations=5 * entries,
            num_inductor_compiles=3 * entries,
            num_cache_hits=2 * entries,
        ),
        torch.no_grad(),
    ):
        for n in (1, 4, 9):
            ids = torch.arange(n)
            torch.testing.assert_close(cm(ids), m(ids), atol=1e-4, rtol=1e-4)
    reused = [p.reused for p in cm.stats.graphs[0].pieces if not p.is_splitting_graph]
    assert reused == [0, 0, entries, entries, 0]


@pytest.mark.slow
def test_four_processes_compile_each_piece_once(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    procs = _start_together(tmp_path, 4, cache, "inductor", 1, OMP_NUM_THREADS="1")
    results = [_result(p) for p in procs]
    assert all(r["ok"] for r in results)
    # One process alone: 2 distinct pieces x 1 range.
    assert sum(r["num_inductor_compiles"] for r in results) == 2
    assert sum(r["num_cache_hits"] for r in results) == 3 * 2
    assert sum(r["num_cache_waits"] for r in results) >= 1
    folders = list((cache / "models").glob("*/backbone/index"))
    assert len(folders) == 1, folders
    report = fxpiece.verify_index(str(folders[0]))
    assert report.ok and report.good_files >= 1
    assert not list((cache / "locks").glob("**/*.lease")), "leases and slots are released"


@pytest.mark.slow
def test_killed_compiler_is_taken_over(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    holder = _spawn(tmp_path, cache, "slow-eager", 0, SLOW_COMPILE="120")
    # Wait until the holder is inside compile (it holds the lease).
    assert holder.stdout is not None
    line = holder.stdout.readline()
    assert line.strip() == "compiling", holder.stderr.read() if holder.stderr else ""
    leases = list((cache / "locks").glob("*.lease"))
    assert len(leases) == 1
    mark = tmp_path / "waits"
    waiter = _spawn(tmp_path, cache, "slow-eager", 0, WAIT_MARK=str(mark))
    _wait_for(
        "the waiter finds the lease taken", lambda: leases[0].resolve() in _marked(mark), [waiter]
    )
    assert waiter.poll() is None, "the waiter is waiting on the lease"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    r = _result(waiter, timeout=120)
    assert r["ok"]
    assert r["num_cache_waits"] == 1, r
    assert r["num_eager_compiles"] == 1  # it took over and compiled
    assert not list((cache / "locks").glob("*.lease"))
    assert not list(cache.rglob(".tmp-*"))


@pytest.mark.slow
def test_foreign_lease_respected_while_fresh_taken_over_when_expired(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # Find the lease path: run once to learn the digest, then clear the index.
    first = _result(_spawn(tmp_path, cache, "eager", 0))
    assert first["num_eager_compiles"] == 1
    index_files = list((cache / "models").glob("*/backbone/index"))
    digest = json.loads(json.dumps(fxpiece.CacheIndex(str(index_files[0])).entries()[0][1]))[
        "digest"
    ]
    for f in index_files:
        for child in f.iterdir():
            child.unlink()
    lease = cache / "locks" / f"{digest}.lease"
    body = {"host": "another-host", "pid": 1, "token": "feedfacefeedface", "ttl": 3.0}
    lease.write_text(json.dumps(body))
    # Fresh foreign lease: the process waits (renew it meanwhile) and gives up
    # only at its lock timeout.
    p = _spawn(tmp_path, cache, "eager", 0, LOCK_TIMEOUT="4", LEASE_TTL="3")
    t_end = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < t_end:
        os.utime(lease, None)
        time.sleep(0.2)
    r = _result(p)
    assert r["num_cache_waits"] == 1
    assert r["wait_s"] >= 3.5, r
    assert read_lease(str(lease)) is not None, "a live foreign lease is never broken"
    # Expired foreign lease (not renewed for > ttl): taken over quickly.
    for f in index_files:
        for child in f.iterdir():
            child.unlink()
    old = time.time() - 60
    os.utime(lease, (old, old))
    r = _result(_spawn(tmp_path, cache, "eager", 0, LOCK_TIMEOUT="600", LEASE_TTL="3"))
    assert r["num_eager_compiles"] == 1
    assert r["wait_s"] < 30
    assert not lease.exists()


@pytest.mark.slow
def test_artifact_of_a_running_compile_is_not_loaded_before_its_kernels(tmp_path: Path) -> None:
    """A compiling process stores the piece's artifact first, then its
    kernel bundle and index entry. Another process that finds the artifact
    while the compile lease is still held waits for the entry (loaded then,
    the artifact would rebuild its C++ kernels on cores the compile needs:
    4 ranks took 2.4x one rank's compile time, bench_ranks --few)."""
    cache = tmp_path / "cache"
    first = _result(_spawn(tmp_path, cache, "inductor", 1))
    assert first["ok"] and first["num_inductor_compiles"] == 2
    # The state between a holder's artifact and its index entry: every
    # piece's artifact stored, no index entry, the leases held (renewed).
    index_files = list((cache / "models").glob("*/backbone/index"))
    digests = [
        v["digest"]
        for f in index_files
        for _, v in fxpiece.CacheIndex(str(f)).entries()
        if isinstance(v, dict) and "digest" in v
    ]
    for f in index_files:
        for child in f.iterdir():
            child.unlink()
    body = {"host": "another-host", "pid": 1, "token": "feedfacefeedface", "ttl": 3.0}
    leases = [cache / "locks" / f"{d}.lease" for d in digests]
    for lease in leases:
        lease.write_text(json.dumps(body))
    p = _spawn(tmp_path, cache, "inductor", 1, LOCK_TIMEOUT="3", LEASE_TTL="3")
    t_end = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < t_end:
        for lease in leases:
            os.utime(lease, None)
        time.sleep(0.2)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 0, err[-3000:]
    r = json.loads(out.strip().splitlines()[-1])
    assert r["ok"]
    # It waited for the holders (then, at its lock timeout, compiled the
    # pieces itself), and never loaded a piece whose kernels it lacked.
    assert r["num_cache_waits"] == 2, r
    assert r["num_inductor_compiles"] == 2, r
    assert "loads the usual way" not in err


def test_lease_rules(tmp_path: Path) -> None:
    p = str(tmp_path / "x.lease")
    a = Lease.try_acquire(p, host="h1", ttl=1.5)
    assert a is not None
    assert Lease.try_acquire(p, host="h2") is None
    info = read_lease(p)
    assert info is not None and info.host == "h1" and info.pid == os.getpid()
    time.sleep(2.0)
    # The heartbeat (every ttl/3) renews it: still fresh after more than its ttl.
    info = read_lease(p)
    assert info is not None and not Lease.is_stale(info, ttl=1.5, host="h2")
    a.release()
    assert not os.path.exists(p)
    # A lease of a dead pid on this host is stale at once.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    lease = {"host": "h1", "ns": namespace_id(), "pid": int(dead.stdout), "token": "t"}
    Path(p).write_text(json.dumps({**lease, "ttl": 999}))
    info = read_lease(p)
    assert info is not None and Lease.is_stale(info, ttl=30, host="h1")
    assert not Lease.is_stale(info, ttl=30, host="other-host")
    # The same host name in another PID namespace (a container): its pids are not ours.
    Path(p).write_text(json.dumps({**lease, "ns": "other-boot:1"}))
    assert not Lease.is_stale(read_lease(p), ttl=30, host="h1")  # type: ignore[arg-type]
    Path(p).write_text(json.dumps(lease))
    b = Lease.take_over(p, info, host="h1", ttl=30)
    assert b is not None and read_lease(p) is not None
    # Taking over a lease that changed since it was seen fails.
    assert Lease.take_over(p, info, host="h1", ttl=30) is None
    b.release()
