"""Shared fixtures: cache folders, subprocess runs (warm starts), Dynamo reset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

import fxpiece
from fxpiece.toy_llama import ToyLlama, ToyLlamaConfig

TESTS_DIR = Path(__file__).resolve().parent
RESULT_MARK = "FXPIECE-TEST-RESULT:"

# Subprocess snippets start with this: helpers to report a JSON result.
PRELUDE = f"""
import json as _json, sys as _sys
_sys.path.insert(0, {str(TESTS_DIR)!r})
def report(value):
    print({RESULT_MARK!r} + _json.dumps(value), flush=True)
"""


@pytest.fixture(scope="session", autouse=True)
def _private_inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Inductor's default cache (used when our cache is off) goes to a
    session folder, so runs never depend on /tmp/torchinductor_<user>."""
    keys = ("TORCHINDUCTOR_CACHE_DIR", "FXPIECE_CACHE_ROOT")
    old = {k: os.environ.get(k) for k in keys}
    base = tmp_path_factory.mktemp("session-caches")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(base / "inductor-default")
    os.environ["FXPIECE_CACHE_ROOT"] = str(base / "fxpiece-default")
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    """A fresh cache root (not created yet: the backend creates it)."""
    return tmp_path / "fxpiece-cache"


class PyRunner:
    """Run a Python snippet in a fresh interpreter (the venv's python)."""

    def __call__(
        self,
        code: str,
        env: Mapping[str, str | None] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = 300,
    ) -> Any:
        """Run ``code``; return the value it passed to ``report(...)``.
        ``env`` entries update the current environment (``None`` removes)."""
        full_env = dict(os.environ)
        for k, v in (env or {}).items():
            if v is None:
                full_env.pop(k, None)
            else:
                full_env[k] = v
        src = PRELUDE + textwrap.dedent(code)
        proc = subprocess.run(
            [sys.executable, "-c", src],
            env=full_env,
            cwd=str(cwd) if cwd is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"subprocess failed (rc={proc.returncode})\n--- stdout\n{proc.stdout[-4000:]}"
                f"\n--- stderr\n{proc.stderr[-8000:]}"
            )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
        if not lines:
            raise AssertionError(f"subprocess reported nothing\n{proc.stdout}\n{proc.stderr}")
        return json.loads(lines[-1][len(RESULT_MARK) :])


NOBODY = 65534
"""The uid and gid another user acts as in attack tests (``setpriv``)."""


def as_nobody(code: str) -> None:
    """Run ``code`` (Python) as uid/gid 65534."""
    subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="session")
def run_py() -> PyRunner:
    return PyRunner()


def counter_diff(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Non-zero differences of two counter snapshots."""
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def snapshot_files(root: Path) -> list[str]:
    """Every file under ``root`` (relative), or [] if it does not exist."""
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# -- shared with subprocesses (they import this module as ``conftest``) --------


def keep_logs(name: str = "fxpiece") -> list[str]:
    """The messages logger ``name`` emits from now on (a list that grows)."""
    import logging

    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record.getMessage())

    logging.getLogger(name).addHandler(Keep())
    return kept


def token_ids(n: int, vocab: int = 512) -> torch.Tensor:
    """Deterministic token ids ``[n]``."""
    return (torch.arange(n, dtype=torch.long) * 37 + 11) % vocab


def make_toy(layers: int, dtype: str = "float32", sdpa: bool = False) -> ToyLlama:
    """The toy Llama (hidden 64), seeded, in eval mode and ``dtype``."""
    model = ToyLlama(ToyLlamaConfig(num_layers=layers, sdpa=sdpa)).eval()
    return model.to(getattr(torch, dtype))


class RecordRange(fxpiece.InductorPass):
    """A post-grad pass that changes nothing and records the compile range
    Inductor runs it for. ``tag`` is its option (enters its uuid)."""

    def __init__(self, tag: str = "rec") -> None:
        self.tag = tag
        self.seen: list[fxpiece.Range | None] = []

    def options(self) -> Any:
        return {"tag": self.tag}

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.seen.append(fxpiece.current_compile_range())


def run_toy(spec: Mapping[str, Any], keep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compile the toy model with ``fxpiece.compile`` and run it for each
    size; used in-process and (through :data:`TOY_SNIPPET`) in subprocesses.

    ``spec``: ``layers``, ``dtype``, ``sdpa``, ``config`` (CompileConfig
    kwargs), ``pass_tag`` (add a :class:`RecordRange`), ``sizes``, ``out`` (a
    file to ``torch.save`` the outputs to). ``keep`` receives the compiled
    model (``cm``), the pass (``rec``) and the outputs (``outs``)."""
    kw = dict(spec["config"])
    rec = None
    if spec.get("pass_tag"):
        rec = RecordRange(spec["pass_tag"])
        kw["post_grad_passes"] = [rec]
    cfg = fxpiece.CompileConfig(**kw)
    model = make_toy(spec["layers"], spec.get("dtype", "float32"), spec.get("sdpa", False))
    cm = fxpiece.compile(model, cfg)
    before = fxpiece.counters.snapshot()
    outs = {}
    diff_first: dict[str, int] = {}
    with torch.no_grad():
        for n in spec["sizes"]:
            outs[n] = cm(token_ids(n))
            if not diff_first:
                diff_first = counter_diff(before, fxpiece.counters.snapshot())
    diff = counter_diff(before, fxpiece.counters.snapshot())
    if keep is not None:
        keep.update(cm=cm, rec=rec, outs=outs, model=model)
    if spec.get("out"):
        torch.save(outs, spec["out"])
    g = cm.stats.graphs[0]
    return {
        "diff": diff,
        "diff_first": diff_first,
        "key": g.cache_key,
        "folder": str(g.cache_folder) if g.cache_folder else None,
        "compiled": [p.compiled for p in g.pieces],
        "loaded": [p.loaded for p in g.pieces],
        "reused": [p.reused for p in g.pieces],
        "pass_seen": [str(r) for r in rec.seen] if rec else [],
        "num_graphs": len(cm.stats.graphs),
    }


TOY_SNIPPET = """
import json
from conftest import run_toy
report(run_toy(json.loads({spec!r})))
"""


def run_toy_subprocess(
    run_py: PyRunner,
    spec: Mapping[str, Any],
    env: Mapping[str, str | None] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = run_py(TOY_SNIPPET.format(spec=json.dumps(spec)), env=env, cwd=cwd)
    return result
