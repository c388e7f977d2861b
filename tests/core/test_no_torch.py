"""The torch-free tests really run without torch: under ``make py-test``
(``tests/core/no_torch`` on ``PYTHONPATH``) importing torch raises, here and
in every subprocess; fxpiece's torch-free modules import without it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

GUARDED = os.environ.get("FXPIECE_TESTS_NO_TORCH") == "1"


@pytest.mark.skipif(not GUARDED, reason="run tests/core through `make py-test` (no_torch guard)")
def test_importing_torch_is_impossible_here_and_in_subprocesses() -> None:
    assert "torch" not in sys.modules
    with pytest.raises(RuntimeError, match="must not import torch"):
        import torch  # noqa: F401
    code = (
        "import fxpiece, fxpiece.cache.admin\n"
        "try:\n    import torch\nexcept RuntimeError as e:\n    print(e)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "must not import torch" in out.stdout, out.stderr
