""":class:`RedisStore`: the remote tier on a Redis server (the ``redis``
client from PyPI, ``pip install 'fxpiece[remote]'``).

Keys (``<p>`` is :attr:`RemoteConfig.key_prefix`, ``fxpiece:v1:`` by default)::

    <p>blob:<digest>          a string: one blob, SET NX (never replaced)
    <p>index:<key>:<tag>      a hash: one model's index entries, field -> value
    <p>models                 a set: "<key>:<tag>" of every model with entries
    <p>lease:<name>           a string with an expiry: the holder's token

Every connection has a connect timeout and a socket timeout, and the client
never retries (one attempt, then :class:`~fxpiece.errors.RemoteUnavailableError`),
so no call waits much longer than ``op_timeout`` on a dead, stopped or
unreachable server. A full server (``maxmemory`` with ``noeviction``)
refuses writes with an ``OOM`` reply: the same error, ``errno.ENOSPC``.
Reads are bounded: a blob or entry over its limit is refused by the server
side of the request (``GETRANGE`` / a Lua length check), not read whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import unquote, urlsplit

from fxpiece.errors import BlobTooLargeError, CacheError, ConfigError, RemoteUnavailableError
from fxpiece.remote.base import (
    Lease,
    RemoteConfig,
    check_digest,
    check_lease_name,
    check_model,
)

if TYPE_CHECKING:
    import redis

__all__ = ["SCHEMES", "RedisStore", "check_url", "redact_url"]

SCHEMES = ("redis", "rediss", "unix")
"""URL schemes :class:`RedisStore` opens (``redis://host:port/db``,
``rediss://`` for TLS, ``unix:///path/to/socket?db=0``)."""

_BATCH_BYTES = 64 << 20
"""Most bytes of blobs :meth:`RedisStore.get_blobs` asks for in one request
(one larger blob goes alone)."""

# KEYS[1] = the lease; ARGV[1] = our token; ARGV[2] = the new ttl in ms.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# KEYS[1] = a model's hash; ARGV[1] = field; ARGV[2] = the size limit.
# The value, nil if absent, or its length (an integer) if over the limit.
_GET_ENTRY = """
local n = redis.call('HSTRLEN', KEYS[1], ARGV[1])
if n > tonumber(ARGV[2]) then return n end
return redis.call('HGET', KEYS[1], ARGV[1])
"""
# KEYS[1] = a model's hash; ARGV[1] = most entries; ARGV[2] = the value limit.
# {0, field, value, ...} or {1, count} (too many) or {2, field, length} (too large).
_ENTRIES = """
local n = redis.call('HLEN', KEYS[1])
if n > tonumber(ARGV[1]) then return {1, n} end
local limit = tonumber(ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
for i = 2, #all, 2 do
  if #all[i] > limit then return {2, all[i - 1], #all[i]} end
end
table.insert(all, 1, 0)
return all
"""


def redact_url(url: str) -> str:
    """``url`` without user name or password (for messages and errors).

    >>> redact_url("redis://user:secret@cache.local:6379/2")
    'redis://cache.local:6379/2'
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "<malformed url>"
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def check_url(url: str) -> None:
    """Refuse (:class:`~fxpiece.errors.ConfigError` on ``remote_cache``) a URL
    :class:`RedisStore` cannot open, naming the problem (without the password).

    >>> check_url("http://cache:6379")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fxpiece.errors.ConfigError: remote_cache: http://cache:6379: the scheme must be one of ...
    """
    if not isinstance(url, str) or "\x00" in url:
        raise ConfigError("remote_cache", f"must be a URL, got {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parses the port: ValueError if it is not a number)
    except ValueError as e:
        raise ConfigError("remote_cache", f"{redact_url(url)} is not a valid URL: {e}") from e
    if parts.scheme not in SCHEMES:
        raise ConfigError(
            "remote_cache",
            f"{redact_url(url)}: the scheme must be one of {', '.join(SCHEMES)} "
            "(e.g. redis://host:6379/0)",
        )
    if parts.scheme != "unix":
        if not parts.hostname:
            raise ConfigError("remote_cache", f"{redact_url(url)} names no host")
        db = unquote(parts.path).lstrip("/")
        if db and not db.isdigit():
            raise ConfigError(
                "remote_cache", f"{redact_url(url)}: the path must be a database number"
            )
    elif not parts.path:
        raise ConfigError("remote_cache", f"{redact_url(url)} names no socket path")


def _import_redis() -> Any:
    try:
        import redis
    except ImportError as e:
        raise ConfigError(
            "remote_cache",
            "a redis:// cache needs the redis client: pip install 'fxpiece[remote]' "
            "(or 'redis>=5')",
        ) from e
    return redis


class RedisStore:
    """A :class:`~fxpiece.remote.base.RemoteStore` on one Redis server.

    Safe to share between threads (a connection pool) and across ``fork``
    (the client reconnects in the child). Opening connects nothing: the first
    request does (call :meth:`ping` to find out early).
    """

    def __init__(self, url: str, config: RemoteConfig | None = None) -> None:
        check_url(url)
        self.config = config if config is not None else RemoteConfig()
        self._url = redact_url(url)
        mod = _import_redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._errors: tuple[type[BaseException], ...] = (mod.RedisError, OSError)
        self._mod = mod
        cfg = self.config
        self._r: redis.Redis = mod.Redis.from_url(
            url,
            socket_connect_timeout=cfg.connect_timeout,
            socket_timeout=cfg.op_timeout,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self._renew = self._r.register_script(_RENEW)
        self._release = self._r.register_script(_RELEASE)
        self._get_entry = self._r.register_script(_GET_ENTRY)
        self._entries = self._r.register_script(_ENTRIES)
        p = cfg.key_prefix
        self._blob_prefix = f"{p}blob:"
        self._models = f"{p}models"

    # -- plumbing -----------------------------------------------------------
    @property
    def url(self) -> str:
        return self._url

    def __repr__(self) -> str:
        return f"RedisStore({self._url!r})"

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _fail(self, what: str, e: BaseException) -> NoReturn:
        """Raise the one error a caller handles for ``e`` (a client error)."""
        ex = self._mod.exceptions
        cfg = self.config
        if isinstance(e, ex.TimeoutError | TimeoutError):
            code = errno.ETIMEDOUT
            why = (
                f"no answer within {cfg.op_timeout:g} s "
                f"(connect {cfg.connect_timeout:g} s): the server is slow, stopped or unreachable"
            )
        elif isinstance(e, ex.OutOfMemoryError):
            code, why = errno.ENOSPC, "the server is full (maxmemory reached)"
        elif isinstance(e, ex.AuthenticationError | ex.NoPermissionError):
            code, why = errno.EACCES, f"access refused: {e}"
        elif isinstance(e, ex.ReadOnlyError):
            code, why = errno.EROFS, "the server is a read-only replica"
        elif isinstance(e, ex.ConnectionError | OSError):
            code = (isinstance(e, OSError) and e.errno) or errno.ECONNREFUSED
            why = f"cannot reach the server: {e}"
        else:
            code, why = errno.EIO, f"the server answered with an error: {e}"
        raise RemoteUnavailableError(code, f"remote cache {self._url}: {what}: {why}", self._url)

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except CacheError:
            raise
        except self._errors as e:
            self._fail(what, e)

    def _too_large(self, what: str, size: int, limit: int) -> BlobTooLargeError:
        return BlobTooLargeError(
            errno.EFBIG,
            f"remote cache {self._url}: {what} is {size} bytes, over the {limit}-byte limit",
            self._url,
        )

    def _index(self, model_tag: str, key: str) -> str:
        check_model(model_tag, key)
        return f"{self.config.key_prefix}index:{key}:{model_tag}"

    def _lease(self, name: str) -> str:
        return f"{self.config.key_prefix}lease:{check_lease_name(name)}"

    def ping(self) -> None:
        with self._guard("ping"):
            self._r.ping()

    def close(self) -> None:
        with contextlib.suppress(*self._errors):
            self._r.close()

    # -- blobs --------------------------------------------------------------
    def get_blob(self, digest: str) -> bytes | None:
        name = self._blob_prefix + check_digest(digest)
        limit = self.config.max_blob_bytes
        with self._guard(f"get blob {digest[:16]}"):
            pipe = self._r.pipeline(transaction=True)
            pipe.exists(name)
            pipe.getrange(name, 0, limit)  # at most limit + 1 bytes
            exists, data = pipe.execute()
        if not exists:
            return None
        if len(data) > limit:
            raise self._too_large(f"blob {digest[:16]}", len(data), limit)
        return bytes(data)

    def get_blobs(self, digests: Sequence[str]) -> dict[str, bytes | BlobTooLargeError]:
        # One request for every length, then the blobs in as few requests as
        # keep each reply under _BATCH_BYTES (a blob over the limit is never
        # read). Blobs are never replaced (SET NX), so a length read first
        # still holds; one evicted in between reads empty: left out.
        names = {d: self._blob_prefix + check_digest(d) for d in dict.fromkeys(digests)}
        limit = self.config.max_blob_bytes
        with self._guard(f"get {len(names)} blobs"):
            pipe = self._r.pipeline(transaction=False)
            for name in names.values():
                pipe.strlen(name)
            sizes = dict(zip(names, pipe.execute(), strict=True))
            out: dict[str, bytes | BlobTooLargeError] = {}
            batch: list[str] = []
            budget = 0
            for d, n in sizes.items():
                if n > limit:
                    out[d] = self._too_large(f"blob {d[:16]}", n, limit)
                elif n > 0:
                    if batch and budget + n > _BATCH_BYTES:
                        out.update(self._read_blobs(batch, names, limit))
                        batch, budget = [], 0
                    batch.append(d)
                    budget += n
            out.update(self._read_blobs(batch, names, limit))
        return out

    def _read_blobs(
        self, batch: list[str], names: dict[str, str], limit: int
    ) -> dict[str, bytes | BlobTooLargeError]:
        if not batch:
            return {}
        pipe = self._r.pipeline(transaction=False)
        for d in batch:
            pipe.getrange(names[d], 0, limit)  # at most limit + 1 bytes
        out: dict[str, bytes | BlobTooLargeError] = {}
        for d, data in zip(batch, pipe.execute(), strict=True):
            if len(data) > limit:
                out[d] = self._too_large(f"blob {d[:16]}", len(data), limit)
            elif data:
                out[d] = bytes(data)
        return out

    def put_blob(self, digest: str, data: bytes) -> bool:
        name = self._blob_prefix + check_digest(digest)
        if len(data) > self.config.max_blob_bytes:
            raise self._too_large(f"blob {digest[:16]}", len(data), self.config.max_blob_bytes)
        with self._guard(f"put blob {digest[:16]}"):
            return bool(self._r.set(name, data, nx=True))

    def has_blob(self, digest: str) -> bool:
        name = self._blob_prefix + check_digest(digest)
        with self._guard(f"look up blob {digest[:16]}"):
            return bool(self._r.exists(name))

    def blob_digests(self) -> Iterator[str]:
        skip = len(self._blob_prefix)
        with self._guard("list blobs"):
            names = list(self._r.scan_iter(match=f"{self._blob_prefix}*", count=1000))
        for raw in names:
            digest = _text(raw)[skip:]
            with contextlib.suppress(ValueError):
                yield check_digest(digest)

    # -- index entries ------------------------------------------------------
    def get_entry(self, model_tag: str, key: str, field: str) -> bytes | None:
        name = self._index(model_tag, key)
        limit = self.config.max_entry_bytes
        with self._guard(f"get entry {field!r} of {model_tag}"):
            got = self._get_entry(keys=[name], args=[field, limit])
        if isinstance(got, int):
            raise self._too_large(f"entry {field!r} of {model_tag}", got, limit)
        return None if got is None else bytes(got)

    def put_entry(
        self, model_tag: str, key: str, field: str, value: bytes, *, if_absent: bool = False
    ) -> bool:
        name = self._index(model_tag, key)
        if len(value) > self.config.max_entry_bytes:
            raise self._too_large(
                f"entry {field!r} of {model_tag}", len(value), self.config.max_entry_bytes
            )
        with self._guard(f"put entry {field!r} of {model_tag}"):
            pipe = self._r.pipeline(transaction=True)
            if if_absent:
                pipe.hsetnx(name, field, value)
            else:
                pipe.hset(name, field, value)
            pipe.sadd(self._models, f"{key}:{model_tag}")
            stored, _ = pipe.execute()
        return bool(stored) or not if_absent

    def entries(self, model_tag: str, key: str) -> dict[str, bytes]:
        name = self._index(model_tag, key)
        cfg = self.config
        with self._guard(f"get the entries of {model_tag}"):
            got = self._entries(keys=[name], args=[cfg.max_entries, cfg.max_entry_bytes])
        if got[0] == 1:
            raise self._too_large(
                f"the index of {model_tag} ({got[1]} entries)", got[1], cfg.max_entries
            )
        if got[0] == 2:
            field = _text(got[1])
            raise self._too_large(f"entry {field!r} of {model_tag}", got[2], cfg.max_entry_bytes)
        flat = got[1:]
        return {_text(flat[i]): bytes(flat[i + 1]) for i in range(0, len(flat), 2)}

    def models(self) -> list[tuple[str, str]]:
        with self._guard("list models"):
            members = self._r.smembers(self._models)
        out = []
        for raw in members:
            key, _, tag = _text(raw).partition(":")
            with contextlib.suppress(ValueError):
                check_model(tag, key)
                out.append((tag, key))
        return sorted(out)

    # -- leases -------------------------------------------------------------
    def acquire_lease(self, name: str, ttl: float) -> Lease | None:
        ms = _ttl_ms(ttl)
        token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
        with self._guard(f"take lease {name}"):
            taken = self._r.set(self._lease(name), token, nx=True, px=ms)
        return Lease(name, token, ms / 1000) if taken else None

    def renew_lease(self, lease: Lease) -> bool:
        ms = _ttl_ms(lease.ttl)
        with self._guard(f"renew lease {lease.name}"):
            return bool(self._renew(keys=[self._lease(lease.name)], args=[lease.token, ms]))

    def release_lease(self, lease: Lease) -> bool:
        with self._guard(f"release lease {lease.name}"):
            return bool(self._release(keys=[self._lease(lease.name)], args=[lease.token]))

    def lease_holder(self, name: str) -> str | None:
        with self._guard(f"look up lease {name}"):
            got = self._r.get(self._lease(name))
        return None if got is None else _text(got)


def _text(raw: bytes | str) -> str:
    """A reply as text (replies are bytes: ``decode_responses`` is off)."""
    return raw if isinstance(raw, str) else raw.decode("utf-8", "replace")


def _ttl_ms(ttl: float) -> int:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86400 * 365:
        raise ValueError(f"a lease ttl is a number of seconds in (0, 1 year], not {ttl!r}")
    return max(1, round(ttl * 1000))
