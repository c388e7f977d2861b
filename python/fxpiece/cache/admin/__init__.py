"""Operating the cache: the verbs behind ``fxpiece cache ...``."""

from fxpiece.cache.admin.scan import (
    ArchiveError,
    list_cache,
    pack_cache,
    prune_cache,
    unpack_cache,
    verify_cache,
)

__all__ = [
    "ArchiveError",
    "list_cache",
    "pack_cache",
    "prune_cache",
    "unpack_cache",
    "verify_cache",
]
