"""The remote tier's interface (:class:`RemoteStore`), its configuration and
its lease, independent of any server.

A remote store holds three kinds of things, all opaque bytes to it:

- **blobs** by digest: immutable, stored only if absent (the first one
  stays, like the local artifact store);
- **index entries** by ``(model tag, key, field)``: one map per model, so a
  warm start reads a model's entries in one request;
- **leases** by name: single-flight across hosts (taken with an expiry,
  renewed while the holder works, released only by their holder).

Every method either does what it says or raises
:class:`~fxpiece.errors.RemoteUnavailableError` (unreachable, a timeout,
full, an error reply) within the configured timeouts: callers warn once
and fall back to the local cache. Nothing read from a store is trusted or
unpickled here: callers verify what they read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fxpiece.errors import BlobTooLargeError, ConfigError

__all__ = [
    "REDIS_STRING_LIMIT",
    "Lease",
    "RemoteConfig",
    "RemoteStore",
    "check_digest",
    "check_lease_name",
    "check_model",
]

REDIS_STRING_LIMIT = 512 << 20
"""The largest value a Redis string can hold (``proto-max-bulk-len``'s default)."""

_DIGEST = re.compile(r"[0-9a-f]{1,128}")
_KEY = re.compile(r"[0-9a-f]{1,128}")
_TAG = re.compile(r"[A-Za-z0-9_+\-][A-Za-z0-9._+\-]{0,127}")
_LEASE = re.compile(r"[A-Za-z0-9._:+\-]{1,200}")


def check_digest(digest: str) -> str:
    """A blob digest: 1-128 lowercase hex digits (``ValueError`` otherwise)."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ValueError(f"a blob digest is 1-128 lowercase hex digits, not {digest!r}")
    return digest


def check_model(model_tag: str, key: str) -> None:
    """A model tag (a safe folder name) and a cache key (lowercase hex)."""
    if not isinstance(model_tag, str) or not _TAG.fullmatch(model_tag) or ".." in model_tag:
        raise ValueError(f"{model_tag!r} is not a model tag (a safe folder name)")
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"a cache key is 1-128 lowercase hex digits, not {key!r}")


def check_lease_name(name: str) -> str:
    """A lease name: 1-200 of letters, digits, ``. _ : + -``."""
    if not isinstance(name, str) or not _LEASE.fullmatch(name):
        raise ValueError(f"a lease name is 1-200 of letters, digits and ._:+-, not {name!r}")
    return name


def _positive(name: str, value: object, high: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= high
    ):
        raise ConfigError(name, f"must be a number of seconds in (0, {high}], got {value!r}")


def _count(name: str, value: object, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ConfigError(name, f"must be an int in [1, {high}], got {value!r}")


@dataclass(frozen=True, slots=True)
class RemoteConfig:
    """How a remote store is used: timeouts, size limits, key prefix.

    >>> RemoteConfig().op_timeout
    2.0
    >>> RemoteConfig(connect_timeout=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fxpiece.errors.ConfigError: remote.connect_timeout: must be a number of seconds in (0, 600]...
    """

    connect_timeout: float = 0.5
    """Seconds to open a connection (after the name is resolved)."""
    op_timeout: float = 2.0
    """Seconds any one read or write on a connection may wait for the server
    (a large blob keeps going while bytes move)."""
    max_blob_bytes: int = 256 << 20
    """Largest blob stored or read; bigger ones raise
    :class:`~fxpiece.errors.BlobTooLargeError` (at most 512 MiB, Redis's limit)."""
    max_entry_bytes: int = 1 << 20
    """Largest index entry value stored or read."""
    max_entries: int = 1 << 16
    """Most entries one model's map may hold when read whole."""
    key_prefix: str = "fxpiece:v1:"
    """Prefix of every server key (one server, many fleets or formats)."""

    def __post_init__(self) -> None:
        _positive("remote.connect_timeout", self.connect_timeout, 600)
        _positive("remote.op_timeout", self.op_timeout, 600)
        _count("remote.max_blob_bytes", self.max_blob_bytes, REDIS_STRING_LIMIT)
        _count("remote.max_entry_bytes", self.max_entry_bytes, REDIS_STRING_LIMIT)
        _count("remote.max_entries", self.max_entries, 1 << 24)
        if not isinstance(self.key_prefix, str) or not re.fullmatch(
            r"[A-Za-z0-9._:+\-]{0,64}", self.key_prefix
        ):
            raise ConfigError(
                "remote.key_prefix",
                f"must be at most 64 of letters, digits and ._:+-, got {self.key_prefix!r}",
            )


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease held on a remote store (see :meth:`RemoteStore.acquire_lease`)."""

    name: str
    token: str
    """Unique to this holder (``<host>:<pid>:<random>``): renew and release
    act only while the server still holds this very token."""
    ttl: float
    """Seconds it lasts unless renewed."""


@runtime_checkable
class RemoteStore(Protocol):
    """A remote cache tier (Redis today; an object store could be another).

    Every method raises :class:`~fxpiece.errors.RemoteUnavailableError` when
    the store cannot be used, within the configured timeouts, and
    ``ValueError`` for a malformed digest, model or lease name.
    """

    @property
    def url(self) -> str:
        """Where the store is, for messages (never with a password)."""
        ...

    def ping(self) -> None:
        """Return if the store answers; raise ``RemoteUnavailableError`` if not."""
        ...

    # -- blobs ------------------------------------------------------------
    def get_blob(self, digest: str) -> bytes | None:
        """The blob stored under ``digest``, or ``None``. One larger than
        ``max_blob_bytes`` raises ``BlobTooLargeError`` (not read whole)."""
        ...

    def get_blobs(self, digests: Sequence[str]) -> dict[str, bytes | BlobTooLargeError]:
        """The blobs stored under ``digests``, in as few requests as the store
        allows (a warm start pulls a model's pieces at once): each present
        one maps to its bytes, or to the ``BlobTooLargeError`` it would
        raise alone (not read); an absent one is left out."""
        ...

    def put_blob(self, digest: str, data: bytes) -> bool:
        """Store ``data`` under ``digest`` unless a blob is there already
        (that one stays). Whether this call stored it. Larger than
        ``max_blob_bytes``: ``BlobTooLargeError``, nothing sent."""
        ...

    def has_blob(self, digest: str) -> bool:
        """Whether a blob is stored under ``digest``."""
        ...

    def blob_digests(self) -> Iterator[str]:
        """Every digest with a blob (for operators: ``fxpiece cache pull``)."""
        ...

    # -- index entries ----------------------------------------------------
    def get_entry(self, model_tag: str, key: str, field: str) -> bytes | None:
        """The value of one index entry of model ``(model_tag, key)``, or ``None``."""
        ...

    def put_entry(
        self, model_tag: str, key: str, field: str, value: bytes, *, if_absent: bool = False
    ) -> bool:
        """Set one index entry (only if absent with ``if_absent``); whether
        this call stored it. Over ``max_entry_bytes``: ``BlobTooLargeError``."""
        ...

    def entries(self, model_tag: str, key: str) -> dict[str, bytes]:
        """Every index entry of one model, in one request (``BlobTooLargeError``
        past ``max_entries`` or with a value over ``max_entry_bytes``)."""
        ...

    def models(self) -> list[tuple[str, str]]:
        """``(model_tag, key)`` of every model with entries."""
        ...

    # -- leases -----------------------------------------------------------
    def acquire_lease(self, name: str, ttl: float) -> Lease | None:
        """Take the lease ``name`` for ``ttl`` seconds if nobody holds it;
        ``None`` if someone does (until they release it or it expires)."""
        ...

    def renew_lease(self, lease: Lease) -> bool:
        """Extend ``lease`` by its ttl from now, only if it is still ours;
        ``False`` if it expired (and maybe someone else holds it now)."""
        ...

    def release_lease(self, lease: Lease) -> bool:
        """Drop ``lease`` only if it is still ours; whether it was."""
        ...

    def lease_holder(self, name: str) -> str | None:
        """The token of whoever holds lease ``name`` now, or ``None``."""
        ...

    def close(self) -> None:
        """Drop the connections (the store is not used afterwards)."""
        ...
