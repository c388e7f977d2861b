"""Many processes on one index: concurrent writers (with and without flock), and
writers killed with SIGKILL at random moments."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
import warnings

import pytest

from fxpiece import CacheIndex, verify_index

# Child processes import only the native module (importing fxpiece does not
# import torch; the backend's modules load lazily).
_LOAD_NATIVE = "from fxpiece import _native as native\n"

# A writer: builds its handle, says "ready", waits for "go" (so all start at
# once), then commits its own keys (single inserts and update() batches) and,
# now and then, a shared key. Any warning (a corrupt file seen) is an error.
_WRITER = r"""
import json, random, sys, warnings
warnings.simplefilter("error")

path, wid, use_flock = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
n_keys, n_shared, compact_after = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
kw = {} if use_flock else {"use_flock": False, "host": f"host{wid}"}
idx = native.CacheIndex(path, compact_after=compact_after, **kw)
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"

rng = random.Random(wid)
last_shared, seq, i, commits, compactions = {}, 0, 0, 0, 0

def shared_write(into):
    global seq
    s = rng.randrange(n_shared)
    seq += 1
    into[(-1, s, 0, "shared")] = {"w": wid, "seq": seq}
    last_shared[s] = seq

while i < n_keys:
    if rng.random() < 0.5:
        idx.insert((wid, i, 0, "own"), {"w": wid, "i": i})
        i += 1
    else:
        n = min(rng.randint(2, 12), n_keys - i)
        batch = {(wid, i + j, 0, "own"): {"w": wid, "i": i + j} for j in range(n)}
        if rng.random() < 0.5:
            shared_write(batch)
        idx.update(batch)
        i += n
    commits += 1
    if rng.random() < 0.2:
        one = {}
        shared_write(one)
        idx.update(one)
        commits += 1
    if rng.random() < 0.05:
        idx.refresh()
    if rng.random() < 0.04:
        # Explicit compactions on top of the automatic ones (which wait for
        # more logs as the index grows). With flock, wait for the lock half of
        # the time (else a busy lock skips); without, they really race.
        compactions += idx.compact(timeout=60.0 if rng.random() < 0.5 else None)
print(json.dumps({"last_shared": last_shared, "commits": commits, "compactions": compactions}),
      flush=True)
"""

# A reader: refreshes in a loop while the writers run; the set of keys it
# sees must only grow (no torn file, no entry that comes and goes).
_READER = r"""
import json, os, sys, time, warnings
warnings.simplefilter("error")

path, stop, use_flock = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
kw = {} if use_flock else {"use_flock": False, "host": "reader"}
idx = native.CacheIndex(path, **kw)
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
seen, refreshes = set(), 0
while not os.path.exists(stop):
    idx.refresh()
    refreshes += 1
    own = {k for k in idx.keys() if k[3] == "own"}
    lost = seen - own
    assert not lost, f"keys disappeared: {sorted(lost)[:5]}"
    seen = own
    time.sleep(0.003)
print(json.dumps({"refreshes": refreshes, "seen": len(seen)}), flush=True)
"""

N_WRITERS = 16
N_KEYS = 200
N_SHARED = 8


def _spawn(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _LOAD_NATIVE + code, *map(str, args)],
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
    writers = [_spawn(_WRITER, path, wid, flag, N_KEYS, N_SHARED, 8) for wid in range(N_WRITERS)]
    readers = [_spawn(_READER, path, stop, flag) for _ in range(2)]
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

# Commits in a loop; prints each committed key only after insert()/update()
# returned. Killed with SIGKILL at a random moment.
_CRASH_WRITER = r"""
import random, sys

path, wid, compact_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
idx = native.CacheIndex(path, compact_after=compact_after)
print("ready", flush=True)
sys.stdin.readline()
rng = random.Random(wid)
i = 0
while True:
    if rng.random() < 0.6:
        idx.insert((wid, i, 0, "crash"), {"w": wid, "i": i})
        print(i, flush=True)
        i += 1
    else:
        n = rng.randint(2, 8)
        idx.update({(wid, i + j, 0, "crash"): {"w": wid, "i": i + j} for j in range(n)})
        print(" ".join(str(i + j) for j in range(n)), flush=True)
        i += n
    if rng.random() < 0.1:
        idx.compact()  # so that kills also land inside compactions
"""

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
            out.append((wid, _spawn(_CRASH_WRITER, path, wid, rng.choice([2, 4, 8, 64]))))
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
