"""Hostile inputs beyond the artifacts: lease files and config values."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fxpiece.cache.lease import MAX_CLOCK_SKEW, Lease, LeaseWatch, acquire_or_wait, read_lease


@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail instead of hanging: anything that blocks is interrupted in 10 s."""

    def boom(*_: object) -> None:
        raise TimeoutError("blocked")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _plant(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "directory":
        path.mkdir()
        (path / "x").write_text("x")
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(8 << 30)  # sparse
    else:
        path.write_bytes(kind.encode("latin-1"))


HOSTILE = ["fifo", "dev_zero", "dangling", "directory", "huge"]
GARBLED = [
    "\xff\xfe not utf-8",
    json.dumps({"host": "h", "pid": 10**30, "token": "t"}),
    '{"host": "h", "pid": 1e999, "token": "t"}',
    json.dumps({"host": "h", "pid": "1", "token": "t"}),
    json.dumps({"host": "h", "pid": 1, "token": ""}),
    "[" * 4000,  # deeper than the JSON parser goes, under the size cap
]


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_lease_is_stale_at_once_and_taken_over(
    tmp_path: Path, kind: str, alarm: None
) -> None:
    p = tmp_path / "d.lease"
    _plant(p, kind)
    info = read_lease(str(p))
    assert info is not None and info.hostile is not None
    assert Lease.is_stale(info, ttl=30)
    t0 = time.monotonic()
    lease = Lease.take_over(str(p), info, ttl=30)
    assert lease is not None, "the planted file was moved aside and the lease taken"
    assert time.monotonic() - t0 < 5
    info2 = read_lease(str(p))
    assert info2 is not None and info2.token == lease.token and info2.hostile is None
    lease.release()


@pytest.mark.parametrize("text", GARBLED)
def test_garbled_lease_never_raises_and_gets_only_a_grace_period(
    tmp_path: Path, text: str, alarm: None
) -> None:
    p = tmp_path / "g.lease"
    _plant(p, text)
    info = read_lease(str(p))
    assert info is not None and info.token == "" and info.hostile is None
    assert not Lease.is_stale(info, ttl=30, grace=5)  # maybe still being written
    old = time.time() - 60
    os.utime(p, (old, old))
    info = read_lease(str(p))
    assert info is not None and Lease.is_stale(info, ttl=30, grace=5)


def test_ttl_written_in_a_foreign_lease_is_ignored(tmp_path: Path, alarm: None) -> None:
    """A lease claiming ttl=1e308 from another host is stale after *our* ttl."""
    p = tmp_path / "f.lease"
    p.write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "t", "ttl": 1e308}))
    old = time.time() - 5
    os.utime(p, (old, old))
    out = acquire_or_wait(str(p), ttl=2.0, timeout=60, poll=lambda: None)
    assert out.lease is not None and out.waited_s < 8
    out.lease.release()


def _future_lease(p: Path, host: str, ahead: float = 600.0) -> None:
    """A lease of a pid on ``host`` (not ours: never judged dead here) dated
    ``ahead`` seconds in the future, as a host whose clock runs ahead writes it."""
    p.write_text(json.dumps({"host": host, "ns": "other-boot:1", "pid": 4242, "token": "t"}))
    t = time.time_ns() + int(ahead * 1e9)
    os.utime(p, ns=(t, t))


def test_lease_dated_in_the_future_is_taken_over_after_ttl_plus_skew(
    tmp_path: Path, alarm: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead holder on a host whose clock runs 10 minutes ahead: the wait
    is bounded by ttl + the allowed skew on the waiter's own clock (it was
    10 minutes + ttl by the file's mtime), and the lease is named once."""
    p = tmp_path / "future.lease"
    _future_lease(p, "fast-clock-host")
    caplog.set_level(logging.WARNING, logger="fxpiece")
    t0 = time.monotonic()
    out = acquire_or_wait(str(p), ttl=0.5, timeout=60, poll=lambda: None)
    took = time.monotonic() - t0
    assert out.lease is not None, "taken over, not timed out"
    assert 0.5 + MAX_CLOCK_SKEW <= took < 0.5 + MAX_CLOCK_SKEW + 2.5, took
    info = read_lease(str(p))
    assert info is not None and info.token == out.lease.token
    said = [r.getMessage() for r in caplog.records if "in the future" in r.getMessage()]
    assert len(said) == 1, said
    assert str(p) in said[0] and "fast-clock-host" in said[0], said
    out.lease.release()


def test_renewed_lease_dated_in_the_future_is_kept(tmp_path: Path, alarm: None) -> None:
    """A live holder whose clock runs ahead renews its lease (every ttl/3,
    each renewal dated 10 minutes ahead): it keeps it for as long as the
    mtime keeps changing, and loses it ttl + skew after it stops."""
    p = tmp_path / "renewed.lease"
    _future_lease(p, "fast-clock-host")
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(0.5 / 3):
            t = time.time_ns() + 600 * 10**9
            os.utime(p, ns=(t, t))

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        watch = LeaseWatch(skew=0.5)
        out = acquire_or_wait(str(p), ttl=0.5, timeout=3.0, poll=lambda: None, watch=watch)
        assert out.lease is None and out.waited_s >= 3.0, "ttl + skew is 1 s: kept 3 times over"
        info = read_lease(str(p))
        assert info is not None and info.token == "t" and info.host == "fast-clock-host"
    finally:
        stop.set()
        renewer.join()
    t0 = time.monotonic()
    out = acquire_or_wait(str(p), ttl=0.5, timeout=30, poll=lambda: None, watch=watch)
    assert out.lease is not None and time.monotonic() - t0 < 1.0 + 2.5
    out.lease.release()


def test_waiter_on_a_fifo_lease_does_not_hang(tmp_path: Path, alarm: None) -> None:
    p = tmp_path / "w.lease"
    os.mkfifo(p)
    out = acquire_or_wait(str(p), ttl=30, timeout=60, poll=lambda: None)
    assert out.lease is not None
    out.lease.release()
