"""Compile slots (fxpiece.cache.slots): a per-host counting semaphore of
lease files. The multi-process behaviour is in test_ranks.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fxpiece
from fxpiece.cache.lease import MAX_CLOCK_SKEW
from fxpiece.cache.slots import CompileSlots, default_parallel_compiles
from fxpiece.errors import ConfigError


def test_count_bounds_holders_and_release_frees(tmp_path: Path) -> None:
    slots = CompileSlots(tmp_path / "s", count=2)
    assert slots.prepare() is None
    a, _ = slots.acquire(timeout=1)
    b, _ = slots.acquire(timeout=1)
    assert a is not None and b is not None and a.path != b.path
    none, waited = slots.acquire(timeout=0.3)
    assert none is None and waited >= 0.3
    a.release()
    c, _ = slots.acquire(timeout=1)
    assert c is not None and c.path == a.path
    b.release()
    c.release()
    assert not list((tmp_path / "s").iterdir())


def test_smaller_count_shares_the_low_slots(tmp_path: Path) -> None:
    wide = CompileSlots(tmp_path, count=4)
    narrow = CompileSlots(tmp_path, count=1)
    held, _ = narrow.acquire(timeout=1)
    assert held is not None
    other, _ = wide.acquire(timeout=1)
    assert other is not None and other.path.endswith("slot-1.lease")
    assert narrow.acquire(timeout=0.1)[0] is None
    held.release()
    other.release()


def test_dead_holder_and_planted_files_are_taken_over(tmp_path: Path) -> None:
    slots = CompileSlots(tmp_path, count=1)
    # A holder that died without releasing (SIGKILL): a real dead pid.
    code = (
        "import sys; from pathlib import Path; from fxpiece.cache.slots import CompileSlots;"
        "s, _ = CompileSlots(Path(sys.argv[1]), 1).acquire(5); print(s.path, flush=True);"
        "import os; os._exit(0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).exists(), "the dead holder left its slot file"
    t0 = time.monotonic()
    taken, _ = slots.acquire(timeout=10)
    assert taken is not None and time.monotonic() - t0 < 5
    taken.release()
    # A FIFO planted where a slot file belongs is not a lease: taken over, never opened.
    os.mkfifo(tmp_path / "slot-0.lease")
    taken, _ = slots.acquire(timeout=10)
    assert taken is not None
    assert Path(taken.path).is_file()
    taken.release()


def test_slot_dated_in_the_future_is_taken_over_after_ttl_plus_skew(tmp_path: Path) -> None:
    """A slot left by a dead holder on a host whose clock runs 10 minutes
    ahead is free after ttl + the allowed clock skew (the slots' own clock)."""
    slot = tmp_path / "slot-0.lease"
    slot.write_text(json.dumps({"host": "fast-clock-host", "ns": "x:1", "pid": 4242, "token": "t"}))
    ahead = time.time() + 600
    os.utime(slot, (ahead, ahead))
    slots = CompileSlots(tmp_path, count=1, ttl=0.5)
    t0 = time.monotonic()
    taken, waited = slots.acquire(timeout=30)
    assert taken is not None and 0.5 + MAX_CLOCK_SKEW <= waited < 0.5 + MAX_CLOCK_SKEW + 2
    assert time.monotonic() - t0 < 0.5 + MAX_CLOCK_SKEW + 2
    taken.release()


@pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    where = tmp_path / "shared"
    where.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(where, 65534, 65534)
    why = CompileSlots(where, count=1).prepare()
    assert why is not None and "uid 65534" in why
    os.chown(where, os.getuid(), os.getgid())
    os.chmod(where, 0o777)
    why = CompileSlots(where, count=1).prepare()
    assert why is not None and "writable by others" in why


def test_default_and_config() -> None:
    assert default_parallel_compiles(compile_threads=1) == len(os.sched_getaffinity(0))
    assert default_parallel_compiles(compile_threads=10_000) == 1
    assert fxpiece.CompileConfig(max_parallel_compiles=3).max_parallel_compiles == 3
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ConfigError, match="max_parallel_compiles"):
            fxpiece.CompileConfig(max_parallel_compiles=bad)  # type: ignore[arg-type]
    env = {"FXPIECE_MAX_PARALLEL_COMPILES": "2"}
    assert fxpiece.CompileConfig.from_env(env).max_parallel_compiles == 2
    with pytest.raises(ConfigError, match="FXPIECE_MAX_PARALLEL_COMPILES"):
        fxpiece.CompileConfig.from_env({"FXPIECE_MAX_PARALLEL_COMPILES": "two"})
