"""Writers in different PID namespaces, same host name, one index folder.

A writer's temp file is named after its host and pid; a pid means nothing in
another PID namespace (a container), so a reader must never take "that pid is
dead here" as proof that the writer is gone. Two writer loops, one inside a
fresh PID namespace (``unshare --pid --fork --mount-proc``) and one outside,
commit to one index while refreshing (which cleans up temp files) as fast as
they can: every commit must succeed and every key must be there afterwards.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time

import pytest
from programs.run import program_argv, program_env

from fxpiece import CacheIndex, verify_index

N = 150


def _unshare_works() -> str | None:
    if not shutil.which("unshare"):
        return "no unshare(1) on this machine"
    proc = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-c",
            "import os; print(os.getpid())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        return f"unshare --pid --fork --mount-proc refused: {proc.stderr.strip()[-300:]}"
    if proc.stdout.strip() != "1":
        return f"unshare did not give a new PID namespace (pid {proc.stdout.strip()!r})"
    return None


def test_writers_in_two_pid_namespaces_with_one_host_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    reason = _unshare_works()
    if reason is not None:
        pytest.skip(reason)
    path = tmp_path / "index"
    start = tmp_path / "start"
    CacheIndex(path)
    env = program_env()  # the writer: tests/programs/pidns_writer.py
    cmd = program_argv("pidns_writer", path, start)
    inner = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", *cmd, "inner", str(N)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    outer = subprocess.Popen(
        [*cmd, "outer", str(N)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    procs = {"inner": inner, "outer": outer}
    try:
        hello = {}
        for name, p in procs.items():
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line, f"{name} writer died: {p.stderr.read() if p.stderr else ''}"
            hello[name] = json.loads(line)
        # Same host name, and the inner writer really is in its own namespace.
        assert hello["inner"]["host"] == hello["outer"]["host"]
        assert hello["inner"]["pid"] == 1
        t0 = time.monotonic()
        start.touch()
        results = {}
        for name, p in procs.items():
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, f"{name} writer failed:\n{err[-3000:]}"
            results[name] = json.loads(out.strip().splitlines()[-1])
        elapsed = time.monotonic() - t0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for name, r in results.items():
        assert r["n_failures"] == 0, (
            f"{name}: {r['n_failures']} of {N} commits failed: {r['failures']}"
        )
        assert r["ok"] == N
    idx = CacheIndex(path)
    for wid in ("inner", "outer"):
        for i in range(N):
            assert idx.get((i, i + 1, 0, wid)) == {"w": wid, "i": i}, (wid, i)
    assert len(idx) == 2 * N
    assert verify_index(path).ok
    assert elapsed < 200


def test_leases_and_temp_files_carry_one_namespace_id(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One formula: the id a compile lease records is the one the native
    core writes into its temp-file names, and another PID namespace on the
    same boot gets another one."""
    from fxpiece import _native
    from fxpiece.cache.lease import Lease, namespace_id, read_lease

    mine = namespace_id()
    assert mine == _native.namespace_id()
    assert re.fullmatch(r"[0-9a-f]{12}", mine), mine
    lease = Lease.try_acquire(str(tmp_path / "x.lease"), host="h", ttl=30.0)
    assert lease is not None
    try:
        info = read_lease(str(tmp_path / "x.lease"))
        assert info is not None and info.ns == mine
    finally:
        lease.release()
    why = _unshare_works()
    if why is not None:
        pytest.skip(why)
    code = "from fxpiece.cache.lease import namespace_id; print(namespace_id())"
    inner = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=program_env({}),
    )
    assert inner.returncode == 0, inner.stderr[-2000:]
    other = inner.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{12}", other) and other != mine
