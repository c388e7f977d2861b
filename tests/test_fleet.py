"""A fleet sharing one cache through a real ``redis-server``
(``CompileConfig.remote_cache``, :mod:`fxpiece.piecewise.remote_tier`).

Every "host" is a fresh process (``programs.fleet_host``) with its own cache
root, its own Inductor folder, its own builder key and, where ``unshare``
allows, its own host name (a UTS namespace); nothing is shared but Redis.
Host A compiles once for the module (``fleet``); the others start from what
it pushed."""

from __future__ import annotations

import json
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
from programs.redis_server import RedisServer
from programs.report import RESULT_MARK
from programs.run import TESTS_DIR, program_argv, program_env

from fxpiece.cache.entries import Entry, handle_artifact
from fxpiece.cache.index import CacheIndex
from fxpiece.cache.store import encode_artifact
from fxpiece.signing import BuilderKey, new_key

CONFIG = {
    "splitting_ops": ["fxpiece_toy::attention"],
    "compiler": "inductor",
    "max_num_tokens": 16,  # one range, two unique pieces: 2 Inductor compiles
}
SIZES = [5, 12]
UNIQUE_PIECES = 2


def _uts_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--uts", "hostname", "fxpiece-probe"],
        capture_output=True,
        check=False,
    )
    return r.returncode == 0


UTS = _uts_works()


@dataclass(frozen=True)
class Fleet:
    base: Path
    server: RedisServer
    keys: dict[str, BuilderKey]
    cold: dict[str, Any]
    """Host A's cold start on database 1 (what the others pull)."""

    def trusted(self, *names: str) -> str:
        return ",".join(str(self.keys[n].public) for n in names)

    def argv(self, name: str, spec: dict[str, Any]) -> list[str]:
        cmd = program_argv("fleet_host", json.dumps(spec))
        if not UTS:
            return cmd
        return [
            *("unshare", "--user", "--map-root-user", "--uts", "sh", "-c"),
            f"hostname fleet-{name} && exec {shlex.join(cmd)}",
        ]

    def start(
        self,
        name: str,
        db: int,
        *,
        trusted: str,
        remote: bool = True,
        home: str | None = None,
        **extra: Any,
    ) -> tuple[subprocess.Popen[str], Path]:
        """Host ``name`` (its key; a new root and Inductor folder unless
        ``home`` names one) on database ``db``, started; and the file its
        outputs go to."""
        home_dir = self.base / (home or f"{name}-{time.monotonic_ns()}")
        home_dir.mkdir(exist_ok=True)
        out = home_dir / f"out-{time.monotonic_ns()}.pt"
        config = {**CONFIG, "cache_dir": str(home_dir / "root")}
        if remote:
            config["remote_cache"] = self.server.db_url(db)
        spec = {"layers": 1, "sizes": SIZES, "config": config, "out": str(out), **extra}
        env = program_env(
            {
                "TORCHINDUCTOR_CACHE_DIR": str(home_dir / "inductor"),
                "FXPIECE_KEY_FILE": str(self.keys[name].path),
                "FXPIECE_TRUSTED_KEYS": trusted,
            }
        )
        proc = subprocess.Popen(
            self.argv(name, spec),
            env=env,
            cwd=TESTS_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return proc, out

    def run(self, name: str, db: int, *, trusted: str, **extra: Any) -> dict[str, Any]:
        proc, out = self.start(name, db, trusted=trusted, **extra)
        return finish(proc, out)


def finish(proc: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"host failed\n{stdout[-3000:]}\n{stderr[-6000:]}"
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_MARK)]
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT_MARK) :])
    result["outs"] = torch.load(out)
    return result


def same_outputs(a: dict[str, Any], b: dict[str, Any]) -> None:
    for n in SIZES:
        torch.testing.assert_close(a["outs"][n], b["outs"][n], rtol=0, atol=0)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base = tmp_path_factory.mktemp("fleet")
    server = RedisServer(base / "redis")
    try:
        keys = {n: new_key(base / "keys" / n / "key") for n in ("a", "b", "c", "d", "out")}
        partial = Fleet(base, server, keys, {})
        cold = partial.run("a", 1, trusted=partial.trusted("a", "b"))
        yield Fleet(base, server, keys, cold)
    finally:
        server.stop()


def test_host_a_compiled_and_pushed(fleet: Fleet) -> None:
    a = fleet.cold
    assert a["diff"]["num_inductor_compiles"] == UNIQUE_PIECES
    # 2 pieces, their 2 kernel bundles, the ahead-of-time entry's saved output.
    assert a["diff"]["num_remote_pushes"] >= UNIQUE_PIECES + 1, a["diff"]
    assert a["warnings"] == []


def test_second_host_warm_starts_from_redis_with_an_empty_root(fleet: Fleet) -> None:
    """Host B: empty root, A's key trusted: 0 compiles, no Dynamo trace,
    the same outputs; its own next start needs nothing from Redis."""
    b = fleet.run("b", 1, trusted=fleet.trusted("a", "b"), home="b")
    assert b["diff"].get("num_inductor_compiles", 0) == 0, b["diff"]
    assert b["compiled"] == 0 and b["loaded"] == UNIQUE_PIECES
    assert b["start"] == "aot-load"
    assert b["diff"]["num_remote_hits"] >= UNIQUE_PIECES + 1
    assert b["diff"].get("num_untrusted_remote", 0) == 0
    assert b["key"] == fleet.cold["key"]
    same_outputs(b, fleet.cold)
    again = fleet.run("b", 1, trusted=fleet.trusted("a", "b"), home="b")
    assert again["diff"].get("num_remote_hits", 0) == 0 and again["compiled"] == 0


@pytest.mark.slow
def test_without_the_remote_tier_the_second_host_compiles(fleet: Fleet) -> None:
    """The reference: the same start with no ``remote_cache`` compiles."""
    d = fleet.run("d", 1, trusted=fleet.trusted("a", "d"), remote=False)
    assert d["diff"]["num_inductor_compiles"] == UNIQUE_PIECES


@pytest.mark.slow
def test_two_cold_hosts_at_once_compile_each_piece_once(fleet: Fleet, tmp_path: Path) -> None:
    """Two empty hosts started together on an empty Redis (database 2):
    each unique piece is compiled once in total (a lease on the server)."""
    go = tmp_path / "go"
    started = [
        fleet.start(n, 2, trusted=fleet.trusted("c", "d"), ready=str(tmp_path / n), go=str(go))
        for n in ("c", "d")
    ]
    deadline = time.monotonic() + 240
    while not all((tmp_path / n).exists() for n in ("c", "d")):
        assert time.monotonic() < deadline and all(p.poll() is None for p, _ in started)
        time.sleep(0.02)
    go.touch()
    c, d = (finish(p, out) for p, out in started)
    compiles = c["diff"].get("num_inductor_compiles", 0) + d["diff"].get("num_inductor_compiles", 0)
    assert compiles == UNIQUE_PIECES, (c["diff"], d["diff"])
    assert c["loaded"] + d["loaded"] >= UNIQUE_PIECES  # what the other compiled
    same_outputs(c, fleet.cold)
    same_outputs(d, fleet.cold)


@pytest.mark.slow
def test_redis_killed_during_a_start(fleet: Fleet, tmp_path: Path) -> None:
    """A cold start whose Redis is killed while it compiles its first piece
    (holding that piece's lease on the server): it finishes with the right
    outputs and one warning, compiling the rest locally."""
    server = RedisServer(tmp_path / "redis")
    try:
        own = Fleet(fleet.base, server, fleet.keys, fleet.cold)
        mid = tmp_path / "mid"
        proc, out = own.start("c", 0, trusted=fleet.trusted("c"), mid=str(mid))
        deadline = time.monotonic() + 240
        while not mid.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        server.signal(signal.SIGKILL)
        server.proc.wait(10)
        Path(f"{mid}.go").touch()
        c = finish(proc, out)
    finally:
        server.stop()
    same_outputs(c, fleet.cold)
    assert c["diff"]["num_remote_errors"] >= 1
    down = [w for w in c["warnings"] if "remote cache" in w]
    assert len(down) == 1 and "local cache only" in down[0], c["warnings"]


@pytest.mark.slow
def test_a_stopped_redis_costs_one_timeout(fleet: Fleet, tmp_path: Path) -> None:
    """Redis frozen (SIGSTOP: it accepts connections, never answers) for a
    host with an empty root: one bounded timeout, one warning, then a local
    compile with the right outputs; never a hang."""
    server = RedisServer(tmp_path / "redis")
    try:
        server.signal(signal.SIGSTOP)
        own = Fleet(fleet.base, server, fleet.keys, fleet.cold)
        t0 = time.monotonic()
        c = own.run("c", 0, trusted=fleet.trusted("c"))
        took = time.monotonic() - t0
    finally:
        server.signal(signal.SIGCONT)
        server.stop()
    same_outputs(c, fleet.cold)
    assert c["diff"]["num_inductor_compiles"] == UNIQUE_PIECES
    assert c["diff"]["num_remote_errors"] == 1, c["diff"]  # then it is not asked again
    down = [w for w in c["warnings"] if "remote cache" in w]
    assert len(down) == 1 and "no answer within 2 s" in down[0], c["warnings"]
    assert took < 240


@pytest.mark.slow
def test_a_full_redis_is_one_warning_and_a_local_cache(fleet: Fleet, tmp_path: Path) -> None:
    """Redis at its memory limit (``maxmemory`` with ``noeviction``: every
    write refused) for a cold host: its pushes fail, it says so once, and
    its start finishes right from its local root; the next start on that
    root compiles nothing."""
    server = RedisServer(
        tmp_path / "redis", "--maxmemory", "1mb", "--maxmemory-policy", "noeviction"
    )
    try:
        own = Fleet(fleet.base, server, fleet.keys, fleet.cold)
        c = own.run("c", 0, trusted=fleet.trusted("c"), home="full")
        again = own.run("c", 0, trusted=fleet.trusted("c"), home="full")
    finally:
        server.stop()
    same_outputs(c, fleet.cold)
    assert c["diff"]["num_inductor_compiles"] == UNIQUE_PIECES
    assert c["diff"]["num_remote_errors"] >= 1, c["diff"]
    down = [w for w in c["warnings"] if "remote cache" in w]
    assert len(down) == 1 and "full" in down[0], c["warnings"]
    assert again["diff"].get("num_inductor_compiles", 0) == 0, again["diff"]
    same_outputs(again, fleet.cold)


def _tear_pulled_pieces(root: Path) -> int:
    """Cut every piece artifact under ``root`` to half its length, as a
    power cut can leave a copy that was never fsynced (the pulled ones are
    fsynced after the start has used them); the number torn."""
    torn = 0
    for index in root.glob("models/*/*/index"):
        if index.parent.name.endswith(".aot"):
            continue  # the ahead-of-time entry stays: the pieces are the point
        for raw_key, value in CacheIndex(str(index)).entries():
            entry = Entry.from_raw(value)
            rel = None if entry is None else handle_artifact(entry.handle)
            if "piece:" not in str(raw_key[-1]) or rel is None:
                continue
            path = root / rel
            data = path.read_bytes()
            os.truncate(path, len(data) // 2)
            torn += 1
    return torn


@pytest.mark.slow
def test_a_torn_pulled_copy_is_moved_aside_and_pulled_again(fleet: Fleet) -> None:
    """Host C pulls everything into an empty root; its pulled piece copies are
    then torn (a power cut before their deferred fsync): its next start
    finds each by its checksum, moves it aside and pulls it again: no
    compile, the same outputs."""
    trusted = fleet.trusted("a", "c")
    c = fleet.run("c", 1, trusted=trusted, home="c-torn")
    assert c["diff"].get("num_inductor_compiles", 0) == 0, c["diff"]
    assert _tear_pulled_pieces(fleet.base / "c-torn" / "root") >= UNIQUE_PIECES
    again = fleet.run("c", 1, trusted=trusted, home="c-torn")
    assert again["diff"].get("num_inductor_compiles", 0) == 0, again["diff"]
    assert again["diff"]["num_corrupt_artifacts"] >= UNIQUE_PIECES, again["diff"]
    assert again["diff"]["num_remote_hits"] >= UNIQUE_PIECES, again["diff"]
    assert again["loaded"] == UNIQUE_PIECES
    same_outputs(again, fleet.cold)
    aside = list((fleet.base / "c-torn" / "root" / "artifacts").glob("*/*.corrupt-*"))
    assert len(aside) >= UNIQUE_PIECES, aside


@pytest.mark.slow
def test_a_complete_local_root_asks_redis_nothing(fleet: Fleet) -> None:
    """A host whose own root holds every piece sends Redis no request on its
    next start (3 layers: the two middle pieces are identical, indexed once,
    and that is not a local miss)."""
    trusted = fleet.trusted("c")
    c = fleet.run("c", 7, trusted=trusted, home="complete", layers=3)
    assert c["diff"]["num_inductor_compiles"] == 3, c["diff"]
    assert c["compiled"] == 3 and c["loaded"] == 0
    client = redis.Redis.from_url(fleet.server.db_url(7))
    try:
        before = client.info("stats")["total_commands_processed"]
        again = fleet.run("c", 7, trusted=trusted, home="complete", layers=3)
        asked = client.info("stats")["total_commands_processed"] - before - 1  # that INFO
    finally:
        client.close()
    assert again["diff"].get("num_inductor_compiles", 0) == 0, again["diff"]
    assert again["diff"].get("num_remote_hits", 0) == 0
    assert asked == 0, f"{asked} requests to Redis on a warm start from a complete root"
    for n in SIZES:
        torch.testing.assert_close(again["outs"][n], c["outs"][n], rtol=0, atol=0)


def _plant(fleet: Fleet, db: int, marker: Path) -> int:
    """Copy database 1 (A's pushes) to ``db``, then overwrite every blob
    there with a pickle that creates ``marker`` when loaded, with a valid
    checksum, bound to its digest and signed by an outsider's key (a writer
    with access to Redis but no trusted key)."""
    src = redis.Redis.from_url(fleet.server.db_url(1))
    dst = redis.Redis.from_url(fleet.server.db_url(db))
    try:
        for name in src.scan_iter(match="fxpiece:v1:*"):
            assert src.copy(name, name, destination_db=str(db), replace=True)
        planted = 0
        for name in dst.scan_iter(match="fxpiece:v1:blob:*"):
            digest = name.decode().rsplit(":", 1)[1]
            payload = pickle.dumps(_Marker(str(marker)))
            dst.set(name, encode_artifact(payload, digest, key=fleet.keys["out"]))
            planted += 1
        return planted
    finally:
        src.close()
        dst.close()


class _Marker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


@pytest.mark.slow
def test_a_planted_pickle_from_a_writer_without_a_trusted_key_never_runs(
    fleet: Fleet, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    assert _plant(fleet, 3, marker) >= UNIQUE_PIECES + 1
    c = fleet.run("c", 3, trusted=fleet.trusted("a", "c"), home="c-planted")
    assert not marker.exists()
    # Never stored either (not even moved aside): refused before it reached the root.
    evil = pickle.dumps(_Marker(str(marker)))
    stored = [p for p in (fleet.base / "c-planted" / "root").rglob("*") if p.is_file()]
    assert stored and not [p for p in stored if evil in p.read_bytes()]
    assert c["diff"]["num_untrusted_remote"] >= 1
    assert c["diff"]["num_inductor_compiles"] == UNIQUE_PIECES
    refused = [w for w in c["warnings"] if "refused from the remote cache" in w]
    assert len(refused) == 1 and "not a trusted key" in refused[0], c["warnings"]
    same_outputs(c, fleet.cold)


@pytest.mark.slow
def test_a_revoked_key_s_entries_are_refused(fleet: Fleet) -> None:
    """A's key revoked (``-KEY``): nothing it pushed is used; recompiled."""
    revoke = f"{fleet.trusted('a', 'd')},-{fleet.keys['a'].public}"
    d = fleet.run("d", 1, trusted=revoke)
    assert d["diff"]["num_untrusted_remote"] >= 1
    assert d["diff"].get("num_remote_hits", 0) == 0
    assert d["diff"]["num_inductor_compiles"] == UNIQUE_PIECES
    same_outputs(d, fleet.cold)
