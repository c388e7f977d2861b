"""The content-addressed artifact store: write-once, self-verifying.

An artifact lives at ``artifacts/<2 hex>/<digest>`` (see
:class:`~fxpiece.cache.layout.CacheLayout`); the digest names what the
artifact *means* (:func:`fxpiece.cache.keys.artifact_digest`). The file is

    FXPIECE-ARTIFACT v2 digest=<hex> blake3=<hex> len=<n>\\n<payload>

so any reader can check it on its own: ``blake3`` is the checksum of the
payload (also kept in the index handle) and ``digest`` the digest it was
stored under. Every read checks that digest against the path the file was
found at (by a handle, by digest, by ``fxpiece cache verify``): a file moved
or copied to another digest's path is corrupt, moved aside and never used,
so one meaning's code never runs for another's. A ``v1`` file (written
before the digest was recorded: ``FXPIECE-ARTIFACT v1 blake3=<hex>
len=<n>``) is bound only by the index handles that recorded its checksum:
it loads through such a handle, and is absent to a lookup by digest alone
(:meth:`ArtifactStore.existing`; :meth:`ArtifactStore.put` moves it aside
and stores its own).

Artifacts are **created if absent, never replaced**: a writer that finds a
valid artifact under the digest keeps it (compiles of one meaning may differ
byte for byte; the first one stays, so every index entry that points at it
stays valid); a corrupt or ``v1`` one is moved aside first. Anything moved
aside goes through :meth:`ArtifactStore.quarantine`, which tells the
store's owner (:class:`~fxpiece.cache.model.ModelCache` drops its index
entries that point at the file, so it is reported once). Loads read the
bytes once (no symlink, FIFO or device is followed), verify them in memory
and hand the verified bytes on: nothing can swap the file between check and
use.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxpiece import _native
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.safeio import open_regular, read_exact
from fxpiece.cache.trust import check_stat, check_trusted, ensure_private_dir
from fxpiece.errors import CacheError, CorruptArtifactError, UntrustedCacheError

__all__ = [
    "ARTIFACT_LIMIT",
    "Artifact",
    "ArtifactStore",
    "checksum",
    "decode_artifact",
    "encode_artifact",
    "parse_artifact",
    "quarantine",
]

ARTIFACT_LIMIT = 4 << 30
"""Largest artifact read (bytes); anything bigger under ``artifacts/`` is hostile."""
_HEADER = re.compile(
    rb"^FXPIECE-ARTIFACT (?:v1|v2 digest=([0-9a-f]{1,128})) blake3=([0-9a-f]{64}) len=(\d{1,20})\n"
)
_DIGEST = re.compile(r"[0-9a-f]{1,128}")


def checksum(payload: bytes | bytearray | memoryview) -> str:
    """The BLAKE3 checksum of an artifact's payload (kept in its header and
    in index handles): ``hash_factors(bytes(payload))``, computed over the
    buffer itself (no copy, GIL released)."""
    return _native.checksum(payload)


def encode_artifact(payload: bytes, digest: str | None = None) -> bytes:
    """The file bytes of an artifact stored under ``digest`` (``v2``);
    without a digest, the legacy ``v1`` form (no longer written by the
    store: it is what caches written before ``v2`` hold)."""
    head = b"FXPIECE-ARTIFACT v1 "
    if digest is not None:
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"an artifact digest is 1-128 lowercase hex digits, not {digest!r}")
        head = b"FXPIECE-ARTIFACT v2 digest=%s " % digest.encode()
    return b"%sblake3=%s len=%d\n%s" % (head, checksum(payload).encode(), len(payload), payload)


@dataclass(frozen=True, slots=True)
class Artifact:
    """A verified artifact file."""

    payload: bytes | bytearray
    """Read from a file: one ``bytearray`` (never copied)."""
    checksum: str
    """BLAKE3 of the payload (what index handles record)."""
    digest: str | None
    """The digest the header binds it to; ``None`` for a ``v1`` file (bound
    only by the index handles that recorded its checksum)."""


def decode_artifact(data: bytes, where: str, digest: str | None = None) -> Artifact:
    """Verify an artifact file's bytes (header, length, checksum and, when
    ``digest`` names the digest it was found under, that its header records
    that very digest); raises :class:`~fxpiece.errors.CorruptArtifactError`
    saying what is wrong."""
    m = _header(data[:_HEAD_MAX], where)
    payload = data[m.end() :]
    del data  # a caller's only reference: freed once sliced
    _check_length(m, len(payload), where)
    return _verified(m, payload, where, digest)


_HEAD_MAX = 128 + 160
"""Longest possible artifact header line."""


def _header(head: bytes, where: str) -> re.Match[bytes]:
    m = _HEADER.match(head)
    if m is None:
        raise CorruptArtifactError(errno.EINVAL, f"{where}: no fxpiece artifact header", where)
    return m


def _check_length(m: re.Match[bytes], have: int, where: str) -> None:
    want = int(m.group(3))
    if have != want:
        raise CorruptArtifactError(
            errno.EINVAL,
            f"{where}: truncated or padded ({have} bytes, header says {want})",
            where,
        )


def _verified(
    m: re.Match[bytes], payload: bytes | bytearray, where: str, digest: str | None
) -> Artifact:
    got = checksum(payload)
    if got != m.group(2).decode():
        raise CorruptArtifactError(errno.EINVAL, f"{where}: checksum mismatch", where)
    bound = None if m.group(1) is None else m.group(1).decode()
    if digest is not None and bound is not None and bound != digest:
        raise CorruptArtifactError(
            errno.EINVAL,
            f"{where}: stored under digest {digest[:16]}.. but written for {bound[:16]}.. "
            "(moved or copied from another digest's path)",
            where,
        )
    return Artifact(payload, got, bound)


def read_artifact(
    path: Path, digest: str | None, check: Callable[[os.stat_result], None] | None = None
) -> Artifact:
    """The verified artifact in the file at ``path`` (see
    :func:`decode_artifact`), read with :func:`~fxpiece.cache.safeio.open_regular`'s
    checks; the payload is read straight into one buffer and checked there,
    so a load needs no memory beyond the payload itself."""
    where = str(path)
    with open_regular(path, ARTIFACT_LIMIT + _HEAD_MAX, check) as (fd, st):
        m = _header(os.pread(fd, _HEAD_MAX, 0), where)
        _check_length(m, st.st_size - m.end(), where)
        payload = read_exact(fd, int(m.group(3)), m.end(), path)
    return _verified(m, payload, where, digest)


def parse_artifact(
    data: bytes, where: str, digest: str | None = None
) -> tuple[bytes | bytearray, str]:
    """``(payload, checksum)`` of an artifact file's bytes (see
    :func:`decode_artifact`, which also tells a ``v1`` file)."""
    art = decode_artifact(data, where, digest)
    return art.payload, art.checksum


def quarantine(path: Path) -> Path | None:
    """Move a bad file aside (``<name>.corrupt-<unix time>[.<n>]``), never
    deleting it nor replacing an earlier quarantined copy (the native core's
    no-replace rename: the one implementation); ``None`` if it cannot be moved."""
    aside = _native.quarantine(path)
    return None if aside is None else Path(aside)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ArtifactStore:
    """Content-addressed artifacts under ``<root>/artifacts``."""

    layout: CacheLayout
    readonly: bool = False
    """Never write, move or touch anything (``cache_readonly``)."""
    trust: bool = False
    """Load artifacts that other users own or can write (``allow_untrusted_cache``)."""
    on_quarantine: Callable[[str], None] | None = field(default=None, compare=False)
    """Called with the relative path (``artifacts/<2 hex>/<digest>``) of each
    artifact this store moved aside (see :meth:`quarantine`)."""

    @property
    def root(self) -> Path:
        return self.layout.root

    def _handle(self, digest: str, payload_sum: str, size: int) -> dict[str, Any]:
        return {"artifact": self.layout.artifact_rel(digest), "blake3": payload_sum, "size": size}

    def quarantine(self, digest: str) -> Path | None:
        """Move the file stored under ``digest`` aside (never in a read-only
        store) and tell :attr:`on_quarantine`, so the index entries that
        point at it go in the same step: the one way anything under
        ``artifacts/`` is moved aside while the cache is used. Where it
        went, or ``None`` if nothing was moved."""
        if self.readonly:
            return None
        aside = quarantine(self.layout.artifact_path(digest))
        if aside is not None and self.on_quarantine is not None:
            self.on_quarantine(self.layout.artifact_rel(digest))
        return aside

    def _read(self, digest: str) -> Artifact | CorruptArtifactError | None:
        """The verified artifact stored under ``digest`` (``v1`` too), ``None``
        if there is none, or the error that made a corrupt, hostile or
        misplaced file move aside."""
        path = self.layout.artifact_path(digest)
        check = None
        if not self.trust:
            check_trusted(path.parent)

            def check(st: os.stat_result) -> None:
                check_stat(path, st, "cached artifact")

        try:
            return read_artifact(path, digest, check)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except UntrustedCacheError:
            raise
        except CacheError as e:
            self.quarantine(digest)
            return CorruptArtifactError(e.errno or errno.EINVAL, e.strerror or str(e), str(path))

    def read(self, digest: str) -> tuple[bytes | bytearray, str] | None:
        """``(payload, checksum)`` of the artifact stored under ``digest``,
        ``None`` if there is none or it is a ``v1`` file (not bound to its
        digest: left alone); a corrupt, hostile or misplaced file is moved
        aside and ``None`` returned."""
        have = self._read(digest)
        if not isinstance(have, Artifact) or have.digest is None:
            return None
        return have.payload, have.checksum

    def lookup(self, digest: str) -> tuple[dict[str, Any] | None, bool]:
        """``(handle, corrupt)``: the handle of the valid artifact stored
        under ``digest`` (by any model, any process; ``None`` if there is
        none or it is a ``v1`` file), and whether a corrupt or misplaced file
        was found there instead (moved aside: count it)."""
        have = self._read(digest)
        if not isinstance(have, Artifact):
            return None, have is not None
        if have.digest is None:
            return None, False
        return self._handle(digest, have.checksum, len(have.payload)), False

    def existing(self, digest: str) -> dict[str, Any] | None:
        """The handle of the valid artifact stored under ``digest`` (by any
        model, any process), or ``None`` (see :meth:`lookup`)."""
        return self.lookup(digest)[0]

    def _keep_or_clear(self, digest: str) -> dict[str, Any] | None:
        """The handle of the valid artifact bound to ``digest``, if any; a
        ``v1`` file there is moved aside (it is replaced, never trusted by
        digest alone), a corrupt one already is."""
        have = self._read(digest)
        if not isinstance(have, Artifact):
            return None
        if have.digest is None:
            self.quarantine(digest)
            return None
        return self._handle(digest, have.checksum, len(have.payload))

    def put(self, digest: str, payload: bytes) -> dict[str, Any]:
        """Store ``payload`` under ``digest`` unless a valid artifact is
        already there (then that one is kept), and return the handle of what
        is stored. Written temp + fsync + link (never replacing a file)."""
        if self.readonly:
            raise CacheError(errno.EROFS, "the cache is read-only", str(self.root))
        have = self._keep_or_clear(digest)
        if have is not None:
            return have
        path = self.layout.artifact_path(digest)
        folder = ensure_private_dir(path.parent)
        tmp = folder / f".tmp-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(encode_artifact(payload, digest))
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                # Another writer stored this digest first: keep theirs.
                theirs = self._keep_or_clear(digest)
                if theirs is not None:
                    return theirs
                os.link(tmp, path)  # theirs was corrupt or v1 and is now aside
            _fsync_dir(folder)
        except OSError as e:
            raise CacheError(
                e.errno or errno.EIO,
                f"cannot store artifact {digest[:16]} in {folder}: {e.strerror or e}",
                str(path),
            ) from e
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return self._handle(digest, checksum(payload), len(payload))

    def load(self, handle: Any) -> bytes | None:
        """The verified payload of the artifact a handle names as ``bytes``
        (see :meth:`load_buffer`), or ``None``."""
        have = self.load_buffer(handle)
        return have if have is None or isinstance(have, bytes) else bytes(have)

    def load_buffer(self, handle: Any) -> bytearray | bytes | None:
        """The verified payload of the artifact a handle names, or ``None``
        (absent, corrupt or stored under another digest: moved aside, or not
        what the handle recorded), so the piece is compiled again.

        The payload is the buffer it was read into and checked in (no copy:
        a large kernel bundle costs its own size once); :meth:`load` gives
        ``bytes``."""
        if not isinstance(handle, dict) or not self.layout.is_artifact_rel(handle.get("artifact")):
            return None
        digest = self.layout.digest_of_artifact(handle["artifact"])
        have = self._read(digest)
        if not isinstance(have, Artifact):
            return None
        if have.checksum != handle.get("blake3"):
            if have.digest is None:
                # A v1 file is bound to its digest by the handle alone: one
                # that does not match was swapped after it was recorded.
                # Move it aside so the recompile can store its own.
                self.quarantine(digest)
            # (A v2 file bound to this digest is another compile of the same
            # meaning, stored after a v1 or corrupt one was moved aside: it
            # stays; the recompile records its handle.)
            return None
        self.touch(self.layout.artifact_path(digest))
        return have.payload

    def touch(self, path: Path) -> None:
        """Record a use (``fxpiece cache prune`` removes least recently used first)."""
        if self.readonly:
            return
        with contextlib.suppress(OSError):  # a read-only mount: uses are not recorded
            os.utime(path, None, follow_symlinks=False)
