"""Typed errors of fxpiece: one base, :class:`FxpieceError`, under all of them.

Every exception also subclasses a standard one so callers can catch broadly:

- :class:`CacheError` (``OSError``): a cache operation failed; ``filename``
  names the path, ``errno`` the OS error when there is one.
- :class:`CorruptIndexError` (``CacheError``): an index file failed
  verification (magic, version, checksum, JSON).
- :class:`CorruptArtifactError` (``CacheError``): an artifact failed
  verification (header, length, checksum).
- :class:`HostileFileError` (``CacheError``): a path under the cache root is
  not a regular file (FIFO, device, symlink, folder) or is over its size cap.
- :class:`LockTimeoutError` (``CacheError``): a lock was not free in time.
- :class:`UntrustedCacheError` (``CacheError``): another user could write
  where fxpiece loads code from.
- :class:`CacheMissError` (``CacheError``): ``require_cache_hit`` and a miss.
- :class:`RemoteUnavailableError` (``CacheError``): the remote cache tier
  (Redis) could not be used: unreachable, too slow (a timeout), full, or it
  answered with an error; ``filename`` names the server (no password). Warn
  once and compile locally.
- :class:`BlobTooLargeError` (``CacheError``): a blob over the remote tier's
  size limit, refused before it is sent or read.
- :class:`KeyFileError` (``OSError``): the builder's signing key or the
  trusted-keys file is unsafe (a symlink, not a regular file, owned by another
  user, a key readable by group or others, a trusted-keys file others can
  write) or malformed; ``filename`` names it. Never used, never repaired.
- :class:`SignatureError` (``ValueError``): a signature was refused:
  :class:`BadSignatureError` when it is malformed or does not verify for its
  payload and kind (tampered with), :class:`UntrustedSignerError` when it is
  valid but no trusted key names its signer (``signer`` says which), and
  :class:`RevokedSignerError` (an ``UntrustedSignerError``) when its signer
  is revoked.
- :class:`ConfigError` (``ValueError``): a configuration field is invalid; the
  message names the field and the fix.
- :class:`SpecializedDimError` (``ConfigError``): a dim marked dynamic
  (``varying_dims`` or ``dynamic_arg_dims``) that the model's code makes a
  constant (a sliding-window KV cache capped at its window); ``dims`` lists
  each one with its constant. Dynamo's ``ConstraintViolationError`` is its
  cause.
- :class:`SizeOutOfRangeError` (``ValueError``): under ``strict``, a token
  count no compiled entry serves.
- :class:`CacheWarning` (``UserWarning``): something on disk was wrong and was
  repaired (a corrupt file moved aside and treated as missing).

The native core (``fxpiece._native``) raises these very classes.
"""

from __future__ import annotations

__all__ = [
    "BadSignatureError",
    "BlobTooLargeError",
    "CacheError",
    "CacheMissError",
    "CacheWarning",
    "ConfigError",
    "CorruptArtifactError",
    "CorruptIndexError",
    "FxpieceError",
    "HostileFileError",
    "KeyFileError",
    "LockTimeoutError",
    "NotRunnableError",
    "RemoteUnavailableError",
    "RevokedSignerError",
    "SignatureError",
    "SizeOutOfRangeError",
    "SpecializedDimError",
    "UntrustedCacheError",
    "UntrustedSignerError",
]


class FxpieceError(Exception):
    """Base of every exception fxpiece raises."""


class CacheError(FxpieceError, OSError):
    """An operation on the compile cache failed; ``filename`` names the path."""


class CorruptIndexError(CacheError):
    """A cache index file failed verification (header, version, checksum or JSON)."""


class CorruptArtifactError(CacheError):
    """A stored artifact failed verification (header, length or checksum)."""


class HostileFileError(CacheError):
    """A path under the cache root is not a regular file, or is too large."""


class LockTimeoutError(CacheError):
    """A cache lock could not be taken within the timeout."""


class UntrustedCacheError(CacheError):
    """Another user could write where fxpiece loads compiled code from
    (Inductor imports generated Python and unpickles)."""


class CacheMissError(CacheError):
    """With ``require_cache_hit``, a piece was not in the cache; the message
    names the factors that differ from the nearest cached key."""


class RemoteUnavailableError(CacheError):
    """The remote cache tier could not be used (unreachable, a timeout, full,
    or an error reply); ``filename`` names the server without its password.
    Nothing was half done that a caller must undo: fall back to the local
    cache and compile."""


class BlobTooLargeError(CacheError):
    """A blob over the remote tier's size limit (``errno.EFBIG``): refused
    before it is sent, or before more than the limit is read."""


class KeyFileError(FxpieceError, OSError):
    """The signing key or trusted-keys file is unsafe or malformed (a
    symlink, not a regular file, owned by another user, a key readable by
    group or others, a trusted-keys file others can write); ``filename``
    names it and the message the fix. Nothing is signed or trusted by it."""


class SignatureError(FxpieceError, ValueError):
    """A signature was refused: see :class:`BadSignatureError`,
    :class:`UntrustedSignerError`, :class:`RevokedSignerError`."""


class BadSignatureError(SignatureError):
    """A signature that is malformed or does not verify for the payload and
    kind it came with (payload, kind or signature tampered with)."""


class UntrustedSignerError(SignatureError):
    """A signature by a key that no trusted key names; ``signer`` is its text
    form (``ed25519:<base64url>``)."""

    def __init__(self, signer: str, message: str) -> None:
        super().__init__(message)
        self.signer = signer


class RevokedSignerError(UntrustedSignerError):
    """A signature by a revoked key (revocation wins over any trust, even in
    one's own key)."""


class ConfigError(FxpieceError, ValueError):
    """A configuration value is invalid.

    ``field`` names the offending field; the message says how to fix it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class SpecializedDimError(ConfigError):
    """A dim fxpiece marked dynamic (``field``: ``"varying_dims"`` or
    ``"dynamic_arg_dims"``) is a constant in the model's code, so it does not
    vary: ``dims`` holds ``(source, constant)`` for each, ``source`` as Dynamo
    names it (``L['kwargs']['cache'].layers[0].keys.size()[2]``)."""

    def __init__(self, field: str, message: str, dims: list[tuple[str, int]]) -> None:
        super().__init__(field, message)
        self.dims = dims


class NotRunnableError(FxpieceError, RuntimeError):
    """A compiled model restored from a pickle was called: its compiled state
    does not survive pickling; compile the model again."""


class SizeOutOfRangeError(FxpieceError, ValueError):
    """Under ``strict``, a token count that no compiled range or size serves."""


class CacheWarning(UserWarning):
    """Something in the cache was wrong and was repaired (e.g. a corrupt file
    moved aside)."""
