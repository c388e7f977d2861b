"""Corruption sweep: every kind of file under a real cache root, broken in
every way, must never crash, hang or change a warm start's output.

One real cache is built once (compiler ``inductor``, the matrix model of
``tests/_matrix_model``, one piece, the range ``[1,16]`` and the size 4).
Then for each kind of file (an index log, an index snapshot, a piece
artifact, the kernel bundle, ``cache_key_factors.json``,
``computation_graph.py``, a compile lease) and each mutation (bytes
flipped, truncated, replaced by a FIFO, a dangling symlink, a symlink out
of the root to a valid copy, a directory), the cache is copied, the file
mutated, and a fresh process warm-starts from the copy under a timeout: it
must exit 0 with the cold run's output, bitwise, and the cache must stay
usable (no fall-back to compiling in memory). A kind read by the same code
as another (the kernel bundle and artifacts, snapshots and logs, the graph
and the factors files) gets only the mutations that differ in meaning
(:data:`CASES`).

The second half feeds hostile files (FIFO, symlink to ``/dev/zero``,
directory, dangling symlink, sparse oversize file) to the Python readers
directly: each returns promptly (``signal.alarm``) with its documented
outcome.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import TESTS_DIR

from fxpiece import CacheIndex
from fxpiece.cache.entries import KernelsKey, decode_key
from fxpiece.cache.explain import FACTORS_LIMIT, read_factors
from fxpiece.cache.layout import FACTORS_FILE, GRAPH_FILE, CacheLayout
from fxpiece.cache.lease import LEASE_LIMIT, namespace_id, read_lease, this_host
from fxpiece.cache.model import ModelCache
from fxpiece.cache.safeio import read_regular
from fxpiece.cache.store import ARTIFACT_LIMIT, ArtifactStore, encode_artifact
from fxpiece.cache.trust import ensure_private_dir
from fxpiece.errors import CacheError, HostileFileError

MODEL_SRC = TESTS_DIR / "_matrix_model" / "src"
DRIVER = TESTS_DIR / "_matrix_model" / "driver.py"
RESULT_MARK = "FXPIECE-TEST-RESULT:"
SIZES = [4, 11]
RUN_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "TORCHINDUCTOR_VEC_ISA_OK": "1",  # see test_mutation_matrix
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
}
TIMEOUT = 120.0

MUTATIONS = ["flip", "truncate", "fifo", "dangling-symlink", "symlink-out", "directory"]
CASES: list[tuple[str, str]] = [
    # Each kind of file with its own reader gets every mutation; a kind read
    # by the same code as another gets only what differs in meaning.
    *[("artifact", m) for m in MUTATIONS],  # ArtifactStore.read, a piece recompiles
    ("kernel-bundle", "flip"),  # the same reader as pieces; kernels are rebuilt
    *[("index-log", m) for m in MUTATIONS],  # the native index
    ("index-snap", "truncate"),  # the same native reader as logs
    *[("factors", m) for m in MUTATIONS],  # ModelCache.write_factors
    ("graph", "truncate"),  # the same writer as the factors
    ("graph", "directory"),
    *[("lease", m) for m in MUTATIONS],  # lease.read_lease and takeover
]

# (kind, mutation) -> why it fails: a known bug; xfail(strict=True) so the
# suite stays green and notices the fix. None left.
KNOWN_BUGS: dict[tuple[str, str], str] = {}
HANGS: set[tuple[str, str]] = set()
"""Known bugs that hang: run with a short timeout (a warm start takes ~5-10 s)."""
HANG_TIMEOUT = 20.0


# -- the cache, built once -------------------------------------------------------


def _run_driver(
    tmp: Path, name: str, runs: list[dict[str, Any]], pkg: Path, timeout: float
) -> tuple[int, list[dict[str, Any]] | None, str]:
    spec_file = tmp / f"{name}.json"
    spec_file.write_text(json.dumps({"pkg": str(pkg), "runs": runs}))
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(spec_file)],
        env={**os.environ, **RUN_ENV},
        cwd=str(tmp),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    result = json.loads(lines[-1][len(RESULT_MARK) :]) if lines else None
    return proc.returncode, result, proc.stderr


def _config(cache: Path) -> dict[str, Any]:
    return {
        "compiler": "inductor",
        "splitting_ops": [],
        "max_num_tokens": 16,
        "compile_sizes": [4],
        "cache_dir": str(cache),
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    tmp = tmp_path_factory.mktemp("sweep")
    pkg = tmp / "pkg"
    shutil.copytree(MODEL_SRC, pkg)
    cache = tmp / "cache"
    cold = tmp / "cold.pt"
    run = {"config": _config(cache), "sizes": SIZES, "out": str(cold), "uncached": True}
    rc, result, err = _run_driver(tmp, "cold", [run], pkg, 600)
    assert rc == 0 and result, err[-3000:]
    r = result[0]
    assert r["diff"].get("num_inductor_compiles", 0) >= 1 and r["vs_uncached"]["equal"], r
    folder = Path(r["folder"])
    index = CacheIndex(str(folder / "index"))
    entries = dict(index.entries())
    kernels = next(v for k, v in sorted(entries.items()) if isinstance(decode_key(k), KernelsKey))
    piece = next(v for k, v in sorted(entries.items()) if not isinstance(decode_key(k), KernelsKey))
    return SimpleNamespace(
        tmp=tmp,
        pkg=pkg,
        cache=cache,
        cold=cold,
        model_rel=folder.relative_to(cache),
        kernels_rel=kernels["handle"]["artifact"],
        piece_rel=piece["handle"]["artifact"],
        piece_digest=piece["digest"],
    )


# -- locating and mutating one file of a kind -----------------------------------


def _index_file(index: Path, prefix: str, avoid: str | None = None) -> Path:
    files = sorted(p for p in index.iterdir() if p.name.startswith(prefix))
    for p in files:
        if avoid is None or avoid not in p.read_text(errors="replace"):
            return p
    assert files, f"no {prefix}* file in {index}"
    return files[0]


def locate(kind: str, b: SimpleNamespace, cache: Path) -> Path:
    """The file of ``kind`` in the copied cache at ``cache`` (set up first
    where the kind does not exist after a plain build)."""
    model = cache / b.model_rel
    index = model / "index"
    if kind == "index-log":
        # A log holding a piece's entry (not the kernel bundle's).
        return _index_file(index, "log-", avoid='"kernels"')
    if kind == "index-snap":
        CacheIndex(str(index)).compact()
        return _index_file(index, "snap-")
    if kind == "artifact":
        return cache / b.piece_rel
    if kind == "kernel-bundle":
        return cache / b.kernels_rel
    if kind == "factors":
        return model / FACTORS_FILE
    if kind == "graph":
        return model / GRAPH_FILE
    if kind == "lease":
        # A lease only exists while a piece compiles: make the piece's
        # artifact missing (so it compiles) and leave a dead holder's lease.
        (cache / b.piece_rel).unlink()
        lease = CacheLayout(cache).lease_path(b.piece_digest)
        lease.parent.mkdir(mode=0o700, exist_ok=True)
        body = {"host": this_host(), "ns": namespace_id(), "pid": _dead_pid(), "token": "t0"}
        lease.write_text(json.dumps(body))
        os.chmod(lease, 0o600)
        return lease
    raise AssertionError(kind)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def mutate(path: Path, mutation: str, outside: Path) -> None:
    data = path.read_bytes()
    if mutation == "flip":
        mid = len(data) // 2
        flipped = bytes(x ^ 0xFF for x in data[mid : mid + 8])
        path.write_bytes(data[:mid] + flipped + data[mid + 8 :])
        return
    if mutation == "truncate":
        os.truncate(path, len(data) // 2)
        return
    path.unlink()
    if mutation == "fifo":
        os.mkfifo(path, 0o600)
    elif mutation == "dangling-symlink":
        os.symlink(outside / "does-not-exist", path)
    elif mutation == "symlink-out":
        outside.mkdir(exist_ok=True)
        copy = outside / path.name
        copy.write_bytes(data)
        os.symlink(copy, path)
    elif mutation == "directory":
        path.mkdir(mode=0o700)
    else:
        raise AssertionError(mutation)


def _param(kind: str, mutation: str) -> Any:
    reason = KNOWN_BUGS.get((kind, mutation))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(kind, mutation, marks=marks, id=f"{kind}-{mutation}")


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "mutation"), [_param(k, m) for k, m in CASES])
def test_warm_start_survives(built: SimpleNamespace, kind: str, mutation: str) -> None:
    case = built.tmp / f"{kind}-{mutation}"
    case.mkdir()
    cache = case / "cache"
    shutil.copytree(built.cache, cache, symlinks=True)
    target = locate(kind, built, cache)
    mutate(target, mutation, case / "outside")
    if kind == "lease":  # left long ago by a crashed compile (no grace period)
        old = time.time() - 3600
        os.utime(target, (old, old), follow_symlinks=False)
    run = {"config": _config(cache), "sizes": SIZES, "expect_out": str(built.cold)}
    timeout = HANG_TIMEOUT if (kind, mutation) in HANGS else TIMEOUT
    t0 = time.perf_counter()
    try:
        rc, result, err = _run_driver(case, "warm", [run], built.pkg, timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"warm start hung (> {timeout:.0f} s) with {target.name} as a {mutation}")
    assert rc == 0 and result, f"warm start failed (rc={rc}): {err[-3000:]}"
    r = result[0]
    assert r["vs_expected"]["equal"] and not r["nan"], r
    # ... and the cache stayed usable (no fallback to compiling in memory).
    assert r["cache_problem"] is None, r["cache_problem"]
    print(
        f"{kind}-{mutation}: {time.perf_counter() - t0:.1f} s, "
        f"compiles {r['diff'].get('num_inductor_compiles', 0)}, "
        f"hits {r['diff'].get('num_cache_hits', 0)}, problem {r['cache_problem']}"
    )


# -- hostile files in the Python readers -----------------------------------------


class StillBlocked(Exception):
    """Raised by :func:`deadline` (not an ``OSError``, which readers catch)."""


@contextlib.contextmanager
def deadline(seconds: int = 5) -> Iterator[None]:
    """Fail instead of hanging: SIGALRM after ``seconds``."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise StillBlocked(f"still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


HOSTILE = ["fifo", "devzero-symlink", "directory", "dangling-symlink", "oversize"]


def plant(path: Path, kind: str, limit: int) -> None:
    """Put a hostile ``kind`` of file at ``path``; ``oversize`` is a sparse
    file one byte over ``limit``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "devzero-symlink":
        os.symlink("/dev/zero", path)
    elif kind == "directory":
        path.mkdir(mode=0o700)
    elif kind == "dangling-symlink":
        os.symlink(path.parent / "nothing-here", path)
    elif kind == "oversize":
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.truncate(path, limit + 1)
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", HOSTILE)
def test_read_regular_refuses(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "f"
    plant(path, kind, 1000)
    with deadline(), pytest.raises(HostileFileError) as info:
        read_regular(path, 1000)
    want = {"oversize": errno.EFBIG, "devzero-symlink": errno.ELOOP}.get(kind)
    if kind == "dangling-symlink":
        want = errno.ELOOP
    if want is not None:
        assert info.value.errno == want, info.value
    assert str(path) in str(info.value)


def test_read_regular_missing_and_regular(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "nothing", 10)
    (tmp_path / "ok").write_bytes(b"x" * 10)
    assert read_regular(tmp_path / "ok", 10) == b"x" * 10


def _store(tmp_path: Path) -> tuple[ArtifactStore, str, Path]:
    layout = CacheLayout(ensure_private_dir(tmp_path / "root"))
    digest = "ab" * 32
    path = layout.artifact_path(digest)
    ensure_private_dir(path.parent)
    return ArtifactStore(layout), digest, path


def _quarantined(path: Path) -> list[str]:
    return [p.name for p in path.parent.iterdir() if CacheLayout.is_quarantined(p.name)]


@pytest.mark.parametrize("kind", HOSTILE)
def test_artifact_store_read_moves_hostile_aside(tmp_path: Path, kind: str) -> None:
    store, digest, path = _store(tmp_path)
    plant(path, kind, ARTIFACT_LIMIT + 256)
    with deadline():
        assert store.read(digest) is None
    assert not os.path.lexists(path), "the hostile file was left in place"
    assert len(_quarantined(path)) == 1


@pytest.mark.parametrize("kind", HOSTILE)
def test_artifact_store_put_replaces_hostile(tmp_path: Path, kind: str) -> None:
    store, digest, path = _store(tmp_path)
    plant(path, kind, ARTIFACT_LIMIT + 256)
    with deadline():
        handle = store.put(digest, b"payload")
    assert handle["artifact"] == CacheLayout.artifact_rel(digest) and handle["size"] == 7
    assert path.is_file() and not path.is_symlink()
    assert path.read_bytes() == encode_artifact(b"payload", digest, key=store.keys.signer())
    with deadline():
        assert store.load(handle) == b"payload"


@pytest.mark.parametrize("kind", HOSTILE)
def test_artifact_store_load_refuses_hostile(tmp_path: Path, kind: str) -> None:
    store, digest, path = _store(tmp_path)
    handle = store.put(digest, b"payload")
    path.unlink()
    plant(path, kind, ARTIFACT_LIMIT + 256)
    with deadline():
        assert store.load(handle) is None
    assert not os.path.lexists(path)


@pytest.mark.parametrize("kind", HOSTILE)
def test_artifact_store_readonly_leaves_hostile_alone(tmp_path: Path, kind: str) -> None:
    store, digest, path = _store(tmp_path)
    plant(path, kind, ARTIFACT_LIMIT + 256)
    ro = ArtifactStore(store.layout, readonly=True)
    with deadline():
        assert ro.read(digest) is None
    assert os.path.lexists(path) and not _quarantined(path)


@pytest.mark.parametrize("kind", HOSTILE)
def test_read_factors_raises_cache_error(tmp_path: Path, kind: str) -> None:
    model = tmp_path / "models" / ("ab" * 16) / "backbone"
    model.mkdir(parents=True)
    plant(model / FACTORS_FILE, kind, FACTORS_LIMIT)
    with deadline(), pytest.raises(CacheError) as info:
        read_factors(model)
    assert FACTORS_FILE in str(info.value)


@pytest.mark.parametrize("kind", HOSTILE)
def test_read_lease_marks_hostile(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "locks" / "x.lease"
    plant(path, kind, LEASE_LIMIT)
    with deadline():
        info = read_lease(str(path))
    assert info is not None and info.hostile, info
    assert not info.token


@pytest.mark.parametrize(
    "kind",
    [
        "fifo",
        "devzero-symlink",
        "directory",
        "dangling-symlink",
        "oversize",
    ],
)
@pytest.mark.parametrize("name", [FACTORS_FILE, GRAPH_FILE])
def test_model_cache_writes_past_hostile_files(tmp_path: Path, kind: str, name: str) -> None:
    """The model folder's readable files are rewritten (or the write fails
    with an ``OSError`` the backend logs) but never block."""
    layout = CacheLayout(ensure_private_dir(tmp_path / "root"))
    mc = ModelCache(layout, "cd" * 32, "backbone")
    plant(mc.folder / name, kind, 1 << 20)
    write: Callable[[Any], None] = mc.write_factors if name == FACTORS_FILE else mc.write_graph
    with deadline(), contextlib.suppress(OSError):
        write({"a": 1} if name == FACTORS_FILE else (lambda: "graph"))
