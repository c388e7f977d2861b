"""Typed errors of fxpiece.

Every exception subclasses a standard one so callers can catch broadly:

- :class:`CacheError` (``OSError``): a cache operation failed; ``filename``
  names the path, ``errno`` the OS error when there is one.
- :class:`CorruptIndexError` (``CacheError``): an index file failed
  verification (magic, version, checksum, JSON).
- :class:`LockTimeoutError` (``CacheError``): a lock was not free in time.
- :class:`ConfigError` (``ValueError``): a configuration field is invalid; the
  message names the field and the fix.
- :class:`CacheWarning` (``UserWarning``): something on disk was wrong and was
  repaired (a corrupt file moved aside and treated as missing).
"""

from __future__ import annotations

from fxpiece._native import CacheError, CacheWarning, CorruptIndexError, LockTimeoutError

__all__ = [
    "CacheError",
    "CacheMissError",
    "CacheWarning",
    "ConfigError",
    "CorruptIndexError",
    "LockTimeoutError",
    "SizeOutOfRangeError",
    "UntrustedCacheError",
]


class ConfigError(ValueError):
    """A configuration value is invalid.

    ``field`` names the offending field; the message says how to fix it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UntrustedCacheError(CacheError):
    """The cache folder can be written by other users, and fxpiece would load
    compiled code (which Inductor imports as Python and pickles) from it."""


class CacheMissError(CacheError):
    """With ``require_cache_hit``, a piece was not in the cache; the message
    names the factors that differ from the nearest cached key."""


class SizeOutOfRangeError(ValueError):
    """Under ``strict``, a token count that no compiled range or size serves."""
