"""Benchmark: peak memory of kernel bundles (fxpiece.piecewise.kernels) on a warm start.

    python benches/bench_bundle.py [--mib 256 [1024 ...]] [--kernels PATH] [--dir DIR]

For each size N (MiB, default 256: about a minute), in fresh subprocesses
(peak RSS = ``VmHWM`` of the child, reset with ``/proc/self/clear_refs`` between
phases):

(a) floor: the child holds a payload of N bytes and nothing else; the
    reference every other number is compared with.
(b) warm start, the real path of ``Backend._restore_kernels``:
    ``ArtifactStore.load_buffer(handle)`` of a stored bundle of N bytes, then
    ``KernelDir.unpack(payload)``. Reported as the whole child's peak and its
    two phases: the load's peak and what the unpack adds on top of the
    payload it was handed.
(c) cold side: ``KernelDir.bundle()`` of N bytes of kernel files (pack only;
    storing it is the store's job).

Ratios are peaks over (a)'s peak; "extra" is MB above (a). The bundle is
built once per size by a setup child (``bundle()`` + ``ArtifactStore.put``),
whose memory is not measured. ``--kernels PATH`` runs the children against
another copy of ``kernels.py`` (e.g. the code before a change). Prints a
report; exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

_FILES = 16
"""Kernel files per bundle (N split evenly)."""


def _status() -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of this process, bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _kernels(path: str | None) -> ModuleType:
    if path is None:
        from fxpiece.piecewise import kernels

        return kernels
    spec = importlib.util.spec_from_file_location("bench_kernels_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _store(root: str) -> Any:
    from fxpiece.cache.layout import CacheLayout
    from fxpiece.cache.store import ArtifactStore

    return ArtifactStore(CacheLayout(root))


# -- children ----------------------------------------------------------------
def child_floor(size: int, work: str, kernels: str | None) -> dict[str, int]:
    _kernels(kernels)
    _store(work)  # the same imports as the other children
    _reset_peak()
    before = _status()["VmRSS"]
    payload = b"\x5a" * size
    peak = _status()["VmHWM"]
    del payload
    return {"base": before, "peak": peak}


def child_setup(size: int, work: str, kernels: str | None) -> dict[str, Any]:
    from fxpiece.cache.keys import kernels_digest
    from fxpiece.cache.store import checksum

    src = Path(work) / "files"
    chunk = size // _FILES
    block = os.urandom(1 << 20)
    for i in range(_FILES):
        part = src / f"k{i % 4}" / f"kernel{i}.so"
        part.parent.mkdir(parents=True, exist_ok=True)
        with open(part, "wb") as f:
            left = chunk + (size - chunk * _FILES if i == _FILES - 1 else 0)
            while left:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
    kd = _kernels(kernels).KernelDir()
    _link_tree(src, kd.path)
    payload = kd.bundle()
    digest = kernels_digest(checksum(payload))
    handle = _store(str(Path(work) / "cache")).put(digest, payload)
    return {"handle": handle, "payload": len(payload)}


def child_restore(size: int, work: str, kernels: str | None) -> dict[str, int]:
    kd = _kernels(kernels).KernelDir()
    store = _store(str(Path(work) / "cache"))
    handle = json.loads((Path(work) / "handle.json").read_text())
    _reset_peak()
    base = _status()["VmRSS"]
    payload = store.load_buffer(handle)
    assert payload is not None, "the stored bundle did not load"
    load_peak = _status()["VmHWM"]
    _reset_peak()
    held = _status()["VmRSS"]
    written = kd.unpack(payload)
    unpack_peak = _status()["VmHWM"]
    assert written == _FILES, written
    return {
        "base": base,
        "peak": max(load_peak, unpack_peak),
        "load_peak": load_peak,
        "held": held,
        "unpack_peak": unpack_peak,
    }


def child_pack(size: int, work: str, kernels: str | None) -> dict[str, int]:
    kd = _kernels(kernels).KernelDir()
    _link_tree(Path(work) / "files", kd.path)
    _reset_peak()
    base = _status()["VmRSS"]
    payload = kd.bundle()
    peak = _status()["VmHWM"]
    assert payload is not None and len(payload) >= size
    return {"base": base, "peak": peak}


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link the kernel files into a KernelDir (no bytes read)."""
    for p in sorted(src.rglob("*.so")):
        to = dst / p.relative_to(src)
        to.parent.mkdir(parents=True, exist_ok=True)
        os.link(p, to)


_CHILDREN = {
    "floor": child_floor,
    "setup": child_setup,
    "restore": child_restore,
    "pack": child_pack,
}


def _run(mode: str, size: int, work: str, kernels: str | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--bytes", str(size), "--dir", work]
    if kernels is not None:
        cmd += ["--kernels", kernels]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _mb(n: float) -> str:
    return f"{n / 1e6:8.0f} MB"


def bench(size: int, root: str, kernels: str | None) -> None:
    work = tempfile.mkdtemp(prefix="bench-bundle-", dir=root)
    try:
        t0 = time.perf_counter()
        setup = _run("setup", size, work, kernels)
        Path(work, "handle.json").write_text(json.dumps(setup["handle"]))
        floor = _run("floor", size, work, kernels)
        restore = _run("restore", size, work, kernels)
        pack = _run("pack", size, work, kernels)
        secs = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ref = floor["peak"]
    print(f"\nN = {size >> 20} MiB (payload {setup['payload']} bytes; {secs:.0f} s)")
    print(f"  (a) floor: hold N bytes        peak {_mb(ref)}   (before: {_mb(floor['base'])})")
    rows = [
        ("(b) load + unpack (warm start)", restore["peak"]),
        ("      load phase", restore["load_peak"]),
        ("      unpack phase", restore["unpack_peak"]),
        ("(c) bundle() (pack)", pack["peak"]),
    ]
    for name, peak in rows:
        print(f"  {name:<30} peak {_mb(peak)}   {peak / ref:5.2f}x   extra {_mb(peak - ref)}")
    print(
        f"  unpack alone adds {_mb(restore['unpack_peak'] - restore['held'])} over the "
        f"payload it is handed ({(restore['unpack_peak'] - restore['held']) / size:.2f} N)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, nargs="+", default=[256], help="bundle sizes (MiB)")
    ap.add_argument("--kernels", help="path of the kernels.py to measure (default: installed)")
    ap.add_argument("--dir", default=None, help="work folder (default: system temp)")
    ap.add_argument("--child", choices=sorted(_CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_CHILDREN[a.child](a.bytes, a.dir, a.kernels)))
        return 0
    root = a.dir or tempfile.gettempdir()
    print(f"kernels: {a.kernels or 'fxpiece.piecewise.kernels'}; python {sys.version.split()[0]}")
    for mib in a.mib:
        bench(mib << 20, root, a.kernels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
