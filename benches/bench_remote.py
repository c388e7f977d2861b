"""Benchmark: blobs through the remote tier (a real redis-server) vs the local store.

    python benches/bench_remote.py [--url redis://host:port/db] [--dir DIR] [--quick]

For blobs of 64 KiB, 4 MiB and 64 MiB: latency (p50, p90) and throughput of

- remote put: :func:`~fxpiece.cache.store.encode_artifact` (signed, ``v3``) +
  ``RedisStore.put_blob``
- remote get: ``RedisStore.get_blob`` + :func:`~fxpiece.cache.store.decode_artifact`
  (header, length, checksum, digest binding, signature by a trusted key:
  what a puller checks)
- local put:  ``ArtifactStore.put`` (temp file + fsync + link + folder fsync)
- local read: ``ArtifactStore.read`` (read once, verified)

printed with the remote / local ratio of each. Every put stores a new digest
(puts are put-if-absent). Without ``--url`` a private ``redis-server`` is
started on a free port (no persistence) and stopped at the end; with one,
the bench writes under a key prefix of its own and deletes what it wrote.
The local store lives under ``--dir`` (default: the system temp folder).
Prints a report; exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from redis_private import private_server

import fxpiece
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.store import ArtifactStore, decode_artifact, encode_artifact
from fxpiece.cache.trust import ensure_private_dir
from fxpiece.remote import RedisStore, RemoteConfig
from fxpiece.signing import BuilderKey, KeyRing, TrustedKeys, new_key

SIZES = ((64 << 10, "64 KiB"), (4 << 20, "4 MiB"), (64 << 20, "64 MiB"))


def reps_for(size: int, quick: bool) -> int:
    if size <= 64 << 10:
        return 50 if quick else 200
    if size <= 4 << 20:
        return 8 if quick else 30
    return 2 if quick else 5


def timed(fn: Callable[[int], object], reps: int) -> list[float]:
    out = []
    for i in range(reps):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def row(name: str, size: int, xs: list[float]) -> tuple[str, float, float, float]:
    p50 = statistics.median(xs)
    return name, p50, pct(xs, 0.9), size / p50 / (1 << 20)


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:9.3f} ms"


def bench_size(
    store: RedisStore, local: ArtifactStore, key: BuilderKey, size: int, reps: int
) -> list[tuple[str, float, float, float]]:
    payload = os.urandom(size)
    trusted = TrustedKeys(frozenset([key.public]))
    tag = secrets.token_hex(4)
    digests = [f"{tag}{i:056x}" for i in range(reps)]

    def remote_put(i: int) -> None:
        assert store.put_blob(digests[i], encode_artifact(payload, digests[i], key=key))

    def remote_get(i: int) -> None:
        data = store.get_blob(digests[i])
        assert data is not None
        art = decode_artifact(data, "bench", digests[i], trusted=trusted, unsigned_ok=False)
        assert art.payload == payload

    def local_put(i: int) -> None:
        local.put(digests[i], payload)

    def local_read(i: int) -> None:
        got = local.read(digests[i])
        assert got is not None and got[0] == payload

    return [
        row("remote put", size, timed(remote_put, reps)),
        row("local put", size, timed(local_put, reps)),
        row("remote get", size, timed(remote_get, reps)),
        row("local read", size, timed(local_read, reps)),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="an existing Redis (default: start a private redis-server)")
    ap.add_argument("--dir", help="folder for the local store (default: system temp)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    a = ap.parse_args(argv)
    cfg = RemoteConfig(key_prefix=f"bench-{secrets.token_hex(4)}:", op_timeout=10.0)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp, contextlib.ExitStack() as st:
        url = a.url or f"redis://127.0.0.1:{st.enter_context(private_server(Path(tmp)))}/0"
        store = st.enter_context(RedisStore(url, cfg))
        # A throwaway builder key (never the user's): blobs are signed like
        # the backend's, and the local store signs with it too.
        key = new_key(Path(tmp) / "keys" / "key")
        local = ArtifactStore(
            CacheLayout(ensure_private_dir(Path(tmp) / "cache")),
            keys=KeyRing(key, TrustedKeys(frozenset([key.public]))),
        )
        print(
            f"fxpiece {fxpiece.__version__} bench_remote: {store.url}, local store in {tmp}; "
            f"{platform.machine()}, {os.cpu_count()} cpu(s), python {platform.python_version()}"
        )
        print("remote = encode + put_blob / get_blob + verify; local = ArtifactStore.put / read")
        for size, label in SIZES:
            reps = reps_for(size, a.quick)
            rows = bench_size(store, local, key, size, reps)
            print(f"\n{label} blobs, {reps} each")
            print(f"  {'':<11}{'p50':>12}{'p90':>12}{'MiB/s':>10}")
            for name, p50, p90, mibs in rows:
                print(f"  {name:<11}{fmt_ms(p50)}{fmt_ms(p90)}{mibs:10.0f}")
            by = {r[0]: r[1] for r in rows}
            print(
                f"  remote/local p50: put {by['remote put'] / by['local put']:.2f}x, "
                f"get {by['remote get'] / by['local read']:.2f}x"
            )
            delete_prefix(url, cfg.key_prefix)  # memory back; nothing left behind
    return 0


def delete_prefix(url: str, prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(url)
    try:
        keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            r.delete(*keys[i : i + 500])
    finally:
        r.close()


if __name__ == "__main__":
    sys.exit(main())
