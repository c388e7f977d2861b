"""fxpiece: a piecewise torch.compile backend with a compile cache many ranks share.

The native core (``fxpiece._native``, Rust) hashes cache-key inputs with
BLAKE3 and keeps the shared cache index; see the README.
"""

from __future__ import annotations

from fxpiece.errors import (
    CacheError,
    CacheWarning,
    ConfigError,
    CorruptIndexError,
    LockTimeoutError,
)
from fxpiece.hashing import FileDigest, FilesReport, hash_factors, hash_files, hash_files_report
from fxpiece.index import CacheIndex, IndexProblem, VerifyReport, verify_index, verify_index_file

__version__ = "0.1.0"

__all__ = [
    "CacheError",
    "CacheIndex",
    "CacheWarning",
    "ConfigError",
    "CorruptIndexError",
    "FileDigest",
    "FilesReport",
    "IndexProblem",
    "LockTimeoutError",
    "VerifyReport",
    "__version__",
    "hash_factors",
    "hash_files",
    "hash_files_report",
    "verify_index",
    "verify_index_file",
]
