"""Inductor's global folders under a real attack by another uid (``setpriv``).

Inductor keeps state outside ``TORCHINDUCTOR_CACHE_DIR`` in
``<TMPDIR>/torchinductor_<user>``: precompiled C++ headers that every kernel
is compiled with, and the compiler bisector's status, which ``torch.compile``
reads before any backend runs. User ``nobody`` creates that folder first
(world-writable, in a sticky ``/tmp`` of the test's own), plants code there,
and the victim's cold and warm starts must never run it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PyRunner, as_nobody, make_toy, run_toy_subprocess, token_ids

from fxpiece.toy_llama import ATTENTION_OP

pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as another uid",
)

USER_DIR = "torchinductor_root"  # the victim is root: Inductor's per-user default folder


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder like /tmp (root's, mode 1777) that the victim uses as TMPDIR."""
    where = Path(tempfile.mkdtemp(prefix="fxpiece-tmp-", dir="/tmp"))
    os.chmod(where, 0o1777)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def spec(cache: Path, out: Path, layers: int, dtype: str = "float32") -> dict[str, Any]:
    return {
        "layers": layers,
        "dtype": dtype,
        "config": {"splitting_ops": [ATTENTION_OP], "cache_dir": str(cache), "max_num_tokens": 32},
        "sizes": [5],
        "out": str(out),
    }


def start(run_py: PyRunner, tmp: Path, s: dict[str, Any]) -> dict[str, Any]:
    """A fresh process of the victim's, with ``tmp`` as its TMPDIR and
    Inductor left at its default folder (as a user who sets nothing has it)."""
    return run_toy_subprocess(run_py, s, env={"TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": None})


def assert_eager(out: Path, layers: int) -> None:
    with torch.no_grad():
        want = make_toy(layers)(token_ids(5))
    torch.testing.assert_close(torch.load(out)[5], want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_planted_precompiled_header_never_runs(
    shared_tmp: Path, tmp_path: Path, run_py: PyRunner
) -> None:
    marker = tmp_path / "pwned"
    glob_headers = shared_tmp / USER_DIR / "precompiled_headers"
    as_nobody(
        "import os\n"
        f"for d in ({str(shared_tmp / USER_DIR)!r}, {str(glob_headers)!r}, "
        f"{str(glob_headers / 'locks')!r}):\n"
        "    os.mkdir(d); os.chmod(d, 0o777)\n"
    )
    a = start(run_py, shared_tmp, spec(tmp_path / "cache-a", tmp_path / "a.pt", layers=1))
    assert a["diff"]["num_inductor_compiles"] > 0
    assert_eager(tmp_path / "a.pt", 1)

    # The attacker knows the header's name (it depends only on the compiler,
    # its flags and torch's headers): plant one for every name the victim
    # uses, wherever it keeps them, in the global folder, and remove any .gch.
    private = shared_tmp / f"fxpiece-{os.getuid()}" / "precompiled_headers"
    names = {p.name: p.read_text() for d in (glob_headers, private) for p in d.glob("*.h")}
    assert names, "the cold start precompiled a header"
    evil = (
        "\n#include <stdio.h>\n__attribute__((constructor)) static void fxpiece_pwned(void) "
        f'{{ FILE* f = fopen("{marker}", "a"); if (f) {{ fputs("pwned\\n", f); fclose(f); }} }}\n'
    )
    plant = {name: text + evil for name, text in names.items()}
    as_nobody(
        "import os, json, glob\n"
        f"d = {str(glob_headers)!r}\n"
        "for p in glob.glob(os.path.join(d, '*.gch')): os.unlink(p)\n"
        f"for name, text in json.loads({json.dumps(json.dumps(plant))}).items():\n"
        "    p = os.path.join(d, name)\n"
        "    if os.path.exists(p): os.unlink(p)\n"
        "    open(p, 'w').write(text)\n"
    )
    assert all((glob_headers / n).stat().st_uid == 65534 for n in plant)

    # Another model, in a cache of its own so every piece compiles again.
    cache_b = tmp_path / "cache-b"
    cold = start(run_py, shared_tmp, spec(cache_b, tmp_path / "b-cold.pt", layers=2))
    assert cold["diff"]["num_inductor_compiles"] > 0
    warm = start(run_py, shared_tmp, spec(cache_b, tmp_path / "b-warm.pt", layers=2))
    assert warm["diff"].get("num_inductor_compiles", 0) == 0
    assert warm["diff"]["num_cache_hits"] > 0
    assert not marker.exists(), "a header planted by another user was built into kernels"
    assert_eager(tmp_path / "b-cold.pt", 2)
    assert_eager(tmp_path / "b-warm.pt", 2)
    # fxpiece's own folder is the victim's, private, and was used.
    st = private.parent.stat()
    assert st.st_uid == os.getuid() and st.st_mode & 0o077 == 0
    assert list(private.glob("*.h.gch"))


@pytest.mark.slow
def test_planted_bisector_status_cannot_swap_the_backend(
    shared_tmp: Path, tmp_path: Path, run_py: PyRunner
) -> None:
    """torch.compile reads ``<folder>/bisect/bisect_status.txt`` before any
    backend runs, and a ``backend=`` line there replaces the backend given."""
    bisect = shared_tmp / USER_DIR / "bisect"
    as_nobody(
        "import os\n"
        f"for d in ({str(bisect.parent)!r}, {str(bisect)!r}):\n"
        "    os.mkdir(d); os.chmod(d, 0o777)\n"
        f"open({str(bisect / 'bisect_status.txt')!r}, 'w').write('backend=eager\\n')\n"
    )
    r = run_py.program(
        "toy_bisect",
        tmp_path / "cache",
        env={"TMPDIR": str(shared_tmp), "TORCHINDUCTOR_CACHE_DIR": None},
    )
    # fxpiece.compile reads its private folder: fxpiece stays the backend.
    assert r["pieces"] >= 3 and r["eager_equal"], r
    # A plain torch.compile would read it: the backend says so, naming the
    # folder and the backend it would swap in.
    (warning,) = [m for m in r["logs"] if "bisector" in m]
    assert str(bisect.parent) in warning and "'eager'" in warning, warning
