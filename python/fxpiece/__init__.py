"""fxpiece: a piecewise torch.compile backend with a compile cache many ranks share.

The native core (``fxpiece._native``, Rust) hashes cache-key inputs with
BLAKE3 and keeps the shared cache index; see the README.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fxpiece import gc_pause
from fxpiece.cache.index import (
    CacheIndex,
    IndexProblem,
    VerifyReport,
    verify_index,
    verify_index_file,
)
from fxpiece.context import current_compile_range, current_model_tag, set_model_tag
from fxpiece.counters import Counters, counters
from fxpiece.errors import (
    CacheError,
    CacheMissError,
    CacheWarning,
    ConfigError,
    CorruptArtifactError,
    CorruptIndexError,
    FxpieceError,
    HostileFileError,
    LockTimeoutError,
    NotRunnableError,
    SizeOutOfRangeError,
    SpecializedDimError,
    UntrustedCacheError,
)
from fxpiece.hashing import FileDigest, FilesReport, hash_factors, hash_files, hash_files_report
from fxpiece.ranges import Range

# Everything that imports torch is imported on first use (PEP 562), so the
# ``fxpiece cache`` commands and torch-free modules start in milliseconds.
if TYPE_CHECKING:
    from fxpiece.api import CompiledModel, compile
    from fxpiece.config import CompileConfig
    from fxpiece.piecewise.backend import Backend
    from fxpiece.piecewise.interface import CompileContext, CompileResult, CompilerInterface
    from fxpiece.piecewise.passes import InductorPass
    from fxpiece.piecewise.split import SplitItem, split_graph
    from fxpiece.piecewise.stats import BackendStats, GraphStats, PieceStats, StartupBreakdown

_LAZY = {
    "CompiledModel": "fxpiece.api",
    "compile": "fxpiece.api",
    "Backend": "fxpiece.piecewise.backend",
    "BackendStats": "fxpiece.piecewise.stats",
    "GraphStats": "fxpiece.piecewise.stats",
    "PieceStats": "fxpiece.piecewise.stats",
    "StartupBreakdown": "fxpiece.piecewise.stats",
    "CompileContext": "fxpiece.piecewise.interface",
    "CompileResult": "fxpiece.piecewise.interface",
    "CompilerInterface": "fxpiece.piecewise.interface",
    "CompileConfig": "fxpiece.config",
    "InductorPass": "fxpiece.piecewise.passes",
    "SplitItem": "fxpiece.piecewise.split",
    "split_graph": "fxpiece.piecewise.split",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fxpiece' has no attribute {name!r}")
    # The compiler stack (torch._dynamo, torch._inductor) comes in here.
    with gc_pause.paused():
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
    "CorruptArtifactError",
    "CorruptIndexError",
    "Counters",
    "FileDigest",
    "FilesReport",
    "FxpieceError",
    "GraphStats",
    "HostileFileError",
    "IndexProblem",
    "InductorPass",
    "LockTimeoutError",
    "NotRunnableError",
    "PieceStats",
    "Range",
    "SizeOutOfRangeError",
    "SpecializedDimError",
    "SplitItem",
    "StartupBreakdown",
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
