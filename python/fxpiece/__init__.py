"""fxpiece: a piecewise torch.compile backend with a compile cache many ranks share.

The native core (``fxpiece._native``, Rust) hashes cache-key inputs with
BLAKE3 and keeps the shared cache index; see the README.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fxpiece.context import current_compile_range, current_model_tag, set_model_tag
from fxpiece.counters import Counters, counters
from fxpiece.errors import (
    CacheError,
    CacheMissError,
    CacheWarning,
    ConfigError,
    CorruptIndexError,
    LockTimeoutError,
    SizeOutOfRangeError,
    UntrustedCacheError,
)
from fxpiece.hashing import FileDigest, FilesReport, hash_factors, hash_files, hash_files_report
from fxpiece.index import CacheIndex, IndexProblem, VerifyReport, verify_index, verify_index_file
from fxpiece.ranges import Range

# Everything that imports torch is imported on first use (PEP 562), so the
# ``fxpiece cache`` commands and torch-free modules start in milliseconds.
if TYPE_CHECKING:
    from fxpiece.api import CompiledModel, compile
    from fxpiece.backend import Backend, BackendStats, GraphStats, PieceStats
    from fxpiece.compiler_interface import CompileContext, CompileResult, CompilerInterface
    from fxpiece.config import CompileConfig
    from fxpiece.passes import InductorPass
    from fxpiece.split import SplitItem, split_graph

_LAZY = {
    "CompiledModel": "fxpiece.api",
    "compile": "fxpiece.api",
    "Backend": "fxpiece.backend",
    "BackendStats": "fxpiece.backend",
    "GraphStats": "fxpiece.backend",
    "PieceStats": "fxpiece.backend",
    "CompileContext": "fxpiece.compiler_interface",
    "CompileResult": "fxpiece.compiler_interface",
    "CompilerInterface": "fxpiece.compiler_interface",
    "CompileConfig": "fxpiece.config",
    "InductorPass": "fxpiece.passes",
    "SplitItem": "fxpiece.split",
    "split_graph": "fxpiece.split",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fxpiece' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendStats",
    "CacheError",
    "CacheIndex",
    "CacheMissError",
    "CacheWarning",
    "CompileConfig",
    "CompileContext",
    "CompileResult",
    "CompiledModel",
    "CompilerInterface",
    "ConfigError",
    "CorruptIndexError",
    "Counters",
    "FileDigest",
    "FilesReport",
    "GraphStats",
    "IndexProblem",
    "InductorPass",
    "LockTimeoutError",
    "PieceStats",
    "Range",
    "SizeOutOfRangeError",
    "SplitItem",
    "UntrustedCacheError",
    "VerifyReport",
    "__version__",
    "compile",
    "counters",
    "current_compile_range",
    "current_model_tag",
    "hash_factors",
    "hash_files",
    "hash_files_report",
    "set_model_tag",
    "split_graph",
    "verify_index",
    "verify_index_file",
]
