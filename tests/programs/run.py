"""Run a test program or a snippet in a fresh interpreter (torch-free)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from programs.report import RESULT_MARK

TESTS_DIR = Path(__file__).resolve().parent.parent
"""The ``tests`` folder: on ``PYTHONPATH`` of every program started here."""

# Snippets start with this: ``report(value)`` passes a JSON result back.
PRELUDE = f"""
import sys as _sys
_sys.path.insert(0, {str(TESTS_DIR)!r})
from programs.report import report
"""


def program_env(env: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The current environment updated with ``env`` (``None`` removes), with
    ``tests/`` first on ``PYTHONPATH`` (so ``python -m programs.<name>`` works)."""
    full = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    paths = [str(TESTS_DIR), *[p for p in full.get("PYTHONPATH", "").split(os.pathsep) if p]]
    full["PYTHONPATH"] = os.pathsep.join(paths)
    return full


def program_argv(name: str, *args: object) -> list[str]:
    """The command line that runs ``tests/programs/<name>.py`` with ``args``."""
    return [sys.executable, "-m", f"programs.{name}", *(str(a) for a in args)]


def _run(
    argv: list[str],
    env: Mapping[str, str | None] | None,
    cwd: str | os.PathLike[str] | None,
    timeout: float,
) -> Any:
    proc = subprocess.run(
        argv,
        env=program_env(env),
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


class PyRunner:
    """Run a program of ``tests/programs`` (:meth:`program`) or a Python
    snippet in a fresh interpreter (the venv's python); return the value it
    passed to ``report(...)``. ``env`` entries update the current environment
    (``None`` removes)."""

    def program(
        self,
        name: str,
        *args: object,
        env: Mapping[str, str | None] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = 300,
    ) -> Any:
        """Run ``python -m programs.<name> *args``."""
        return _run(program_argv(name, *args), env, cwd, timeout)

    def __call__(
        self,
        code: str,
        env: Mapping[str, str | None] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = 300,
    ) -> Any:
        """Run the snippet ``code`` (prefer a program: ruff and mypy see it)."""
        src = PRELUDE + textwrap.dedent(code)
        return _run([sys.executable, "-c", src], env, cwd, timeout)


def run_toy_subprocess(
    run_py: PyRunner,
    spec: Mapping[str, Any],
    env: Mapping[str, str | None] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """:func:`programs.toy.run_toy` in a fresh interpreter."""
    result: dict[str, Any] = run_py.program("run_toy", json.dumps(spec), env=env, cwd=cwd)
    return result
