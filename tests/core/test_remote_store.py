"""The remote tier's building blocks on a real ``redis-server`` (Debian's
package; ``make redis`` installs it): blobs, index entries, leases between
processes, a server killed, stopped or full, and what ``fxpiece cache pull``
refuses. Torch-free; the push/pull round trip with a compiled model is
``tests/test_remote_push_pull.py``.

One server serves the module (each test its own key prefix); tests that
kill, stop or fill a server start their own.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from programs.redis_server import RedisServer, free_port

from fxpiece.cache.index import CacheIndex
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.store import encode_artifact
from fxpiece.errors import BlobTooLargeError, CacheError, ConfigError, RemoteUnavailableError
from fxpiece.remote import Lease, RedisStore, RemoteConfig, RemoteStore, open_remote
from fxpiece.remote.sync import entry_field, pull_cache, sign_entry
from fxpiece.signing import builder_key

_SCRIPT = shutil.which("fxpiece", path=str(Path(sys.executable).parent))
CLI = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "fxpiece"]
OP_TIMEOUT = 0.5
BOUND = 5 * OP_TIMEOUT
"""A failing call returns within this (5x the configured timeout): never a hang."""


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start a server of this test's own (killed, stopped or filled)."""
    started: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        started.append(RedisServer(tmp_path / f"redis-{len(started)}", *args))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def _config(**kw: Any) -> RemoteConfig:
    return RemoteConfig(key_prefix=f"t{secrets.token_hex(6)}:", **kw)


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    """A store on the module's server under a key prefix of this test's own."""
    with RedisStore(redis_server.url, _config()) as s:
        yield s


def digest(n: int) -> str:
    return f"{n:064x}"


KEY = "ab" * 32


# -- blobs --------------------------------------------------------------------------


def test_redis_store_is_a_remote_store(store: RedisStore) -> None:
    assert isinstance(store, RemoteStore)
    store.ping()


@pytest.mark.parametrize("size", [0, 1, 65536, 5 << 20])
def test_blob_round_trip(store: RedisStore, size: int) -> None:
    data = os.urandom(size)
    assert store.get_blob(digest(size)) is None
    assert not store.has_blob(digest(size))
    assert store.put_blob(digest(size), data) is True
    assert store.has_blob(digest(size))
    assert store.get_blob(digest(size)) == data
    assert digest(size) in set(store.blob_digests())


def test_put_if_absent_keeps_the_first(store: RedisStore) -> None:
    assert store.put_blob(digest(1), b"first")
    assert store.put_blob(digest(1), b"second") is False
    assert store.get_blob(digest(1)) == b"first"


def test_blob_limit_refuses_writes_and_bounds_reads(redis_server: RedisServer) -> None:
    cfg = _config(max_blob_bytes=1000)
    with RedisStore(redis_server.url, cfg) as small:
        with pytest.raises(BlobTooLargeError) as e:
            small.put_blob(digest(2), b"x" * 1001)
        assert e.value.errno == errno.EFBIG
        assert not small.has_blob(digest(2))  # nothing was sent
        assert small.put_blob(digest(3), b"x" * 1000)
        # A bigger blob stored by a store with another limit is not read whole.
        big = RemoteConfig(key_prefix=cfg.key_prefix, max_blob_bytes=1 << 20)
        with RedisStore(redis_server.url, big) as other:
            assert other.put_blob(digest(4), b"y" * 5000)
        with pytest.raises(BlobTooLargeError, match="over the 1000-byte limit"):
            small.get_blob(digest(4))


def test_get_blobs_is_get_blob_for_many(store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Present blobs map to their bytes (across several reply batches),
    absent ones are left out, duplicates asked once."""
    from fxpiece.remote import redis_store

    monkeypatch.setattr(redis_store, "_BATCH_BYTES", 100_000)  # 3 blobs per batch
    blobs = {digest(500 + i): os.urandom(30_000 + i) for i in range(8)}
    for d, data in blobs.items():
        assert store.put_blob(d, data)
    asked = [*blobs, digest(9999), next(iter(blobs))]
    got = store.get_blobs(asked)
    assert got == blobs
    assert got == {d: store.get_blob(d) for d in blobs}
    assert store.get_blobs([]) == {}


def test_get_blobs_refuses_a_blob_over_the_limit_alone(redis_server: RedisServer) -> None:
    cfg = _config(max_blob_bytes=1000)
    big = RemoteConfig(key_prefix=cfg.key_prefix, max_blob_bytes=1 << 20)
    with RedisStore(redis_server.url, big) as other:
        assert other.put_blob(digest(600), b"y" * 5000)
        assert other.put_blob(digest(601), b"small")
    with RedisStore(redis_server.url, cfg) as small:
        got = small.get_blobs([digest(600), digest(601)])
    assert got[digest(601)] == b"small"
    err = got[digest(600)]
    assert isinstance(err, BlobTooLargeError) and err.errno == errno.EFBIG
    assert "5000 bytes, over the 1000-byte limit" in str(err)


def test_bad_names_are_value_errors(store: RedisStore) -> None:
    for bad in ("", "ABC", "../x", "g" * 4, "a" * 129):
        with pytest.raises(ValueError):
            store.put_blob(bad, b"x")
    with pytest.raises(ValueError):
        store.put_entry("../etc", KEY, "f", b"v")
    with pytest.raises(ValueError):
        store.get_blobs([digest(1), "ABC"])
    with pytest.raises(ValueError):
        store.entries("tag", "not-hex")
    with pytest.raises(ValueError):
        store.acquire_lease("a b", 1)
    with pytest.raises(ValueError):
        store.acquire_lease("x", 0)


# -- index entries ------------------------------------------------------------------


def test_index_entries_per_model(store: RedisStore) -> None:
    f1, f2 = entry_field((1, 8, 0, "inductor")), entry_field((9, 64, 0, "inductor"))
    assert store.entries("backbone", KEY) == {}
    assert store.get_entry("backbone", KEY, f1) is None
    assert store.put_entry("backbone", KEY, f1, b'{"a":1}')
    assert store.put_entry("backbone", KEY, f2, b'{"b":2}')
    assert store.put_entry("head", KEY, f1, b'{"c":3}')
    assert store.get_entry("backbone", KEY, f1) == b'{"a":1}'
    assert store.entries("backbone", KEY) == {f1: b'{"a":1}', f2: b'{"b":2}'}
    assert store.entries("head", KEY) == {f1: b'{"c":3}'}
    assert store.entries("backbone", "cd" * 32) == {}
    # if_absent keeps what is there; a plain put replaces it.
    assert store.put_entry("backbone", KEY, f1, b'{"a":9}', if_absent=True) is False
    assert store.get_entry("backbone", KEY, f1) == b'{"a":1}'
    assert store.put_entry("backbone", KEY, f1, b'{"a":9}')
    assert store.get_entry("backbone", KEY, f1) == b'{"a":9}'
    assert store.models() == [("backbone", KEY), ("head", KEY)]


def test_entry_limits(redis_server: RedisServer) -> None:
    cfg = _config(max_entry_bytes=100, max_entries=3)
    with RedisStore(redis_server.url, cfg) as s:
        with pytest.raises(BlobTooLargeError):
            s.put_entry("m", KEY, "f", b"v" * 101)
        assert s.entries("m", KEY) == {}
        for i in range(3):
            s.put_entry("m", KEY, f"f{i}", b"v" * 100)
        assert len(s.entries("m", KEY)) == 3
        s.put_entry("m", KEY, "f3", b"v")
        with pytest.raises(BlobTooLargeError, match="4 entries"):
            s.entries("m", KEY)
        roomy = RemoteConfig(key_prefix=cfg.key_prefix)
        with RedisStore(redis_server.url, roomy) as other:
            other.put_entry("n", KEY, "big", b"w" * 500)
        with pytest.raises(BlobTooLargeError, match="over the 100-byte limit"):
            s.get_entry("n", KEY, "big")
        with pytest.raises(BlobTooLargeError, match="over the 100-byte limit"):
            s.entries("n", KEY)


# -- leases -------------------------------------------------------------------------

LEASE_SCRIPT = """
import json, os, sys, time
from fxpiece.remote import RedisStore, RemoteConfig
url, prefix, go = sys.argv[1], sys.argv[2], sys.argv[3]
store = RedisStore(url, RemoteConfig(key_prefix=prefix))
store.ping()  # connected before the start signal
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
lease = store.acquire_lease("piece-0", 30.0)
print(json.dumps({"pid": os.getpid(), "token": lease.token if lease else None}), flush=True)
"""


def test_lease_single_flight_between_two_processes(
    redis_server: RedisServer, store: RedisStore, tmp_path: Path
) -> None:
    """Two processes started together: exactly one takes the lease."""
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                LEASE_SCRIPT,
                redis_server.url,
                store.config.key_prefix,
                str(go),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    assert all(p.stdout is not None and p.stdout.readline().strip() == "ready" for p in procs)
    go.touch()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=30)
        assert p.returncode == 0
        results.append(json.loads(out))
    winners = [r for r in results if r["token"] is not None]
    assert len(winners) == 1, results
    assert store.lease_holder("piece-0") == winners[0]["token"]
    assert winners[0]["token"].split(":")[1] == str(winners[0]["pid"])


def test_lease_expiry_lets_another_take_over(redis_server: RedisServer) -> None:
    cfg = _config()
    with RedisStore(redis_server.url, cfg) as a, RedisStore(redis_server.url, cfg) as b:
        mine = a.acquire_lease("piece-1", 0.3)
        assert mine is not None
        assert b.acquire_lease("piece-1", 0.3) is None
        start = time.monotonic()
        theirs = None
        while theirs is None and time.monotonic() - start < 5:
            theirs = b.acquire_lease("piece-1", 30)
            time.sleep(0.01)
        assert theirs is not None, "the lease never expired"
        assert 0.1 < time.monotonic() - start < 3
        # The old holder can neither renew nor release the new holder's lease.
        assert a.renew_lease(mine) is False
        assert a.release_lease(mine) is False
        assert a.lease_holder("piece-1") == theirs.token
        assert b.release_lease(theirs) is True
        assert a.lease_holder("piece-1") is None


def test_renewed_lease_is_kept(redis_server: RedisServer) -> None:
    cfg = _config()
    with RedisStore(redis_server.url, cfg) as a, RedisStore(redis_server.url, cfg) as b:
        mine = a.acquire_lease("piece-2", 0.3)
        assert mine is not None
        end = time.monotonic() + 1.2  # four ttls
        while time.monotonic() < end:
            assert a.renew_lease(mine)
            assert b.acquire_lease("piece-2", 0.3) is None
            time.sleep(0.05)
        assert a.release_lease(mine)
        assert b.acquire_lease("piece-2", 0.3) is not None


def test_release_by_a_non_owner_does_nothing(store: RedisStore) -> None:
    mine = store.acquire_lease("piece-3", 30)
    assert mine is not None
    forged = Lease("piece-3", "otherhost:1:0000", 30)
    assert store.release_lease(forged) is False
    assert store.renew_lease(forged) is False
    assert store.lease_holder("piece-3") == mine.token
    assert store.release_lease(Lease("piece-4", mine.token, 30)) is False  # no such lease
    assert store.release_lease(mine) is True
    assert store.release_lease(mine) is False


# -- a dead, stopped or full server ------------------------------------------------


def _timed(fn: Callable[[], Any]) -> tuple[BaseException | None, float]:
    start = time.monotonic()
    try:
        fn()
    except BaseException as e:
        return e, time.monotonic() - start
    return None, time.monotonic() - start


def test_server_killed_mid_operation(own_server: Callable[..., RedisServer]) -> None:
    server = own_server()
    s = RedisStore(server.url, RemoteConfig(op_timeout=OP_TIMEOUT))
    data = os.urandom(4 << 20)
    assert s.put_blob(digest(5), data)
    # Stop the server so the next request is surely in flight, then kill it.
    server.signal(signal.SIGSTOP)
    got: list[tuple[BaseException | None, float]] = []
    t = threading.Thread(target=lambda: got.append(_timed(lambda: s.get_blob(digest(5)))))
    t.start()
    time.sleep(0.1)
    server.kill()
    t.join(BOUND + 5)
    assert not t.is_alive(), "the call hangs"
    (err, took) = got[0]
    assert isinstance(err, RemoteUnavailableError), err
    assert took < BOUND
    # Every later call fails the same way, fast (nothing listens).
    for call in (
        lambda: s.put_blob(digest(6), data),
        lambda: s.get_blob(digest(5)),
        lambda: s.entries("m", KEY),
        lambda: s.acquire_lease("piece-5", 5),
        s.ping,
    ):
        err, took = _timed(call)
        assert isinstance(err, RemoteUnavailableError), err
        assert err.errno == errno.ECONNREFUSED
        assert took < BOUND
    s.close()


def test_stopped_server_times_out_then_recovers(own_server: Callable[..., RedisServer]) -> None:
    server = own_server()
    s = RedisStore(server.url, RemoteConfig(op_timeout=OP_TIMEOUT))
    assert s.put_blob(digest(7), b"kept")
    server.signal(signal.SIGSTOP)
    try:
        for call in (
            lambda: s.get_blob(digest(7)),
            lambda: s.get_blobs([digest(7)]),
            lambda: s.acquire_lease("p", 5),
        ):
            err, took = _timed(call)
            assert isinstance(err, RemoteUnavailableError), err
            assert err.errno == errno.ETIMEDOUT
            assert OP_TIMEOUT * 0.9 < took < BOUND
    finally:
        server.signal(signal.SIGCONT)
    # No stale reply is read as the answer to a later request.
    assert s.get_blob(digest(7)) == b"kept"
    assert s.acquire_lease("p", 5) is not None
    s.close()


def test_nothing_listening_fails_fast() -> None:
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    with RedisStore(url, RemoteConfig(op_timeout=OP_TIMEOUT)) as s:
        err, took = _timed(s.ping)
    assert isinstance(err, RemoteUnavailableError)
    assert isinstance(err, CacheError) and isinstance(err, OSError)  # one except clause
    assert took < BOUND
    assert "s3cret" not in str(err) and "s3cret" not in s.url


def test_full_server_is_a_typed_error(own_server: Callable[..., RedisServer]) -> None:
    server = own_server("--maxmemory", "1mb", "--maxmemory-policy", "noeviction")
    s = RedisStore(server.url, RemoteConfig(op_timeout=2.0))
    stored = []
    with pytest.raises(RemoteUnavailableError) as e:
        for i in range(100):  # 6.4 MiB at most: far over 1 MiB
            s.put_blob(digest(100 + i), os.urandom(65536))
            stored.append(i)
    assert e.value.errno == errno.ENOSPC
    assert "full" in str(e.value)
    # Writes of every kind are refused the same way; reads still work.
    for call in (
        lambda: s.put_entry("m", KEY, "f", b"v" * 65536),
        lambda: s.acquire_lease("piece-6", 5),
    ):
        with pytest.raises(RemoteUnavailableError) as e:
            call()
        assert e.value.errno == errno.ENOSPC
    if stored:
        assert s.get_blob(digest(100 + stored[0])) is not None
    s.close()


def test_config_and_url_errors() -> None:
    for bad in ("http://host/0", "redis://", "redis://host:port/0", "redis://host/x", "x"):
        with pytest.raises(ConfigError, match="remote_cache"):
            open_remote(bad)
    with pytest.raises(ConfigError, match=r"remote\.op_timeout"):
        RemoteConfig(op_timeout=float("inf"))
    with pytest.raises(ConfigError, match=r"remote\.max_blob_bytes"):
        RemoteConfig(max_blob_bytes=1 << 30)
    with pytest.raises(ConfigError, match=r"remote\.key_prefix"):
        RemoteConfig(key_prefix="a b")


# -- fxpiece cache push / pull (the round trip with a compiled model:
# tests/test_remote_push_pull.py) ------------------------------------------------


def fx(*args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, timeout=300, check=False
    )


def test_pull_refuses_what_fails_its_check(store: RedisStore, tmp_path: Path) -> None:
    """A blob under another digest's name, a blob without a header, a
    malformed entry: refused, listed, nothing of them written."""
    key = builder_key()  # this builder's own key (trusted by default)
    good, moved, junk, old = digest(10), digest(11), digest(12), digest(13)
    store.put_blob(good, encode_artifact(b"good payload", good, key=key))
    moved_blob = encode_artifact(b"other payload", digest(99), key=key)  # valid checksum
    store.put_blob(moved, moved_blob)
    store.put_blob(junk, b"\x80\x04 not an artifact")
    store.put_blob(old, encode_artifact(b"unsigned payload", old))  # v2: refused remotely
    for n, d in ((0, good), (1, moved), (2, junk), (5, old)):
        value = {"digest": d, "handle": {"artifact": CacheLayout.artifact_rel(d), "blake3": "0"}}
        field = entry_field((1, 8, n, "inductor"))
        signed = sign_entry(key, KEY, "m", field, value)
        store.put_entry("m", KEY, field, json.dumps(signed).encode())
    store.put_entry("m", KEY, "[1,2]", b"{}")
    store.put_entry("m", KEY, entry_field((1, 8, 3, "inductor")), b"not json")
    evil = {"digest": digest(14), "handle": {"artifact": "../outside", "blake3": "0"}}
    f4 = entry_field((1, 8, 4, "inductor"))
    store.put_entry("m", KEY, f4, json.dumps(sign_entry(key, KEY, "m", f4, evil)).encode())
    no_digest = {"handle": {"artifact": CacheLayout.artifact_rel(good), "blake3": "0"}}
    f7 = entry_field((1, 8, 7, "inductor"))
    store.put_entry("m", KEY, f7, json.dumps(sign_entry(key, KEY, "m", f7, no_digest)).encode())
    unsigned = {"digest": good, "handle": {"artifact": CacheLayout.artifact_rel(good)}}
    store.put_entry("m", KEY, entry_field((1, 8, 6, "inductor")), json.dumps(unsigned).encode())

    res = pull_cache(tmp_path / "root", store)
    assert not res.ok
    assert res.artifacts_written == 1 and res.entries_written == 1
    text = "\n".join(res.refused)
    assert "written for" in text  # the digest binding
    assert "no fxpiece artifact header" in text
    assert "malformed" in text and "outside artifacts/" in text
    assert '[1,8,7,"inductor"]: not an index entry' in text  # signed, but no digest
    assert "unsigned (written before v3" in text  # the v2 blob
    assert "unsigned index entry" in text
    lay = CacheLayout(tmp_path / "root")
    assert lay.artifact_path(good).is_file()
    assert not lay.artifact_path(moved).exists() and not lay.artifact_path(junk).exists()
    index = CacheIndex(str(lay.index_dir(lay.model_dir(KEY, "m"))), readonly=True)
    assert [k for k, _ in index.entries()] == [(1, 8, 0, "inductor")]
    assert index.get((1, 8, 0, "inductor"))["handle"]["blake3"] != "0"  # the local handle


def test_push_to_a_dead_server_is_one_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    proc = fx("cache", "push", root, f"redis://127.0.0.1:{free_port()}/0")
    assert proc.returncode == 1
    assert proc.stderr.startswith("fxpiece: error: remote cache redis://127.0.0.1:")
    assert "Traceback" not in proc.stderr
