"""Makes importing torch impossible: ``make py-test`` runs ``tests/core``
with this folder on ``PYTHONPATH`` (the interpreter imports ``sitecustomize``
at start-up), so the pytest process, its xdist workers and every Python
subprocess they start fail loudly on ``import torch``.

Raises :class:`TorchImportBlocked`, not an ``ImportError``: code that treats
a missing torch as optional cannot silently take another path."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

os.environ["FXPIECE_TESTS_NO_TORCH"] = "1"


class TorchImportBlocked(RuntimeError):
    """``import torch`` in a process that must never import it."""


class _BlockTorch(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torch" or fullname.startswith("torch."):
            raise TorchImportBlocked(f"tests/core must not import torch (imported {fullname!r})")
        return None


sys.meta_path.insert(0, _BlockTorch())
