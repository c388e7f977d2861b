"""The remote cache tier: a cache shared by hosts through a server.

The local cache root stays the first tier; a remote store is the second,
reached through the small :class:`RemoteStore` interface (blobs by digest,
index entries by model, leases for single-flight across hosts), so another
kind of store can be added beside :class:`RedisStore`.

>>> from fxpiece.remote import RemoteConfig, open_remote
>>> store = open_remote("redis://127.0.0.1:6379/0", RemoteConfig(op_timeout=1.0))
>>> store.url
'redis://127.0.0.1:6379/0'
>>> store.close()

=====================  ==================================================
:mod:`.base`           :class:`RemoteStore`, :class:`RemoteConfig`, :class:`Lease`
:mod:`.redis_store`    :class:`RedisStore` (``redis://``, ``rediss://``, ``unix://``)
:mod:`.sync`           :func:`push_cache`, :func:`pull_cache` (``fxpiece cache push/pull``)
=====================  ==================================================

Failures are one error, :class:`~fxpiece.errors.RemoteUnavailableError`
(and :class:`~fxpiece.errors.BlobTooLargeError` for a blob over the limit).
"""

from __future__ import annotations

from fxpiece.remote.base import Lease, RemoteConfig, RemoteStore
from fxpiece.remote.redis_store import SCHEMES, RedisStore, redact_url

__all__ = [
    "SCHEMES",
    "Lease",
    "RedisStore",
    "RemoteConfig",
    "RemoteStore",
    "open_remote",
    "redact_url",
]


def open_remote(url: str, config: RemoteConfig | None = None) -> RemoteStore:
    """The remote store at ``url`` (connects on first use). Raises
    :class:`~fxpiece.errors.ConfigError` for a URL no store handles."""
    return RedisStore(url, config)
