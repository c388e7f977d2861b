"""The content-addressed artifact store: write-once, self-verifying.

An artifact lives at ``artifacts/<2 hex>/<digest>`` (see
:class:`~fxpiece.cache.layout.CacheLayout`); the digest names what the
artifact *means* (:func:`fxpiece.cache.keys.artifact_digest`). The file is

    FXPIECE-ARTIFACT v1 blake3=<hex> len=<n>\\n<payload>

so any reader can check it on its own, and its checksum is also kept in the
index handle. Artifacts are **created if absent, never replaced**: a writer
that finds a valid artifact under the digest keeps it (compiles of one
meaning may differ byte for byte; the first one stays, so every index entry
that points at it stays valid); a corrupt one is moved aside first. Loads
read the bytes once (no symlink, FIFO or device is followed), verify them in
memory and hand the verified bytes on: nothing can swap the file between
check and use.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxpiece import _native
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.safeio import read_regular
from fxpiece.cache.trust import check_stat, check_trusted, ensure_private_dir
from fxpiece.errors import CacheError, CorruptArtifactError, UntrustedCacheError
from fxpiece.hashing import hash_factors

__all__ = ["ARTIFACT_LIMIT", "ArtifactStore", "checksum", "parse_artifact", "quarantine"]

ARTIFACT_LIMIT = 4 << 30
"""Largest artifact read (bytes); anything bigger under ``artifacts/`` is hostile."""
_MAGIC = b"FXPIECE-ARTIFACT v1 "
_HEADER = re.compile(rb"^FXPIECE-ARTIFACT v1 blake3=([0-9a-f]{64}) len=(\d{1,20})\n")


def checksum(payload: bytes) -> str:
    """The BLAKE3 checksum of an artifact's payload (kept in its header and
    in index handles)."""
    return hash_factors(payload)


def encode_artifact(payload: bytes) -> bytes:
    return b"%sblake3=%s len=%d\n%s" % (_MAGIC, checksum(payload).encode(), len(payload), payload)


def parse_artifact(data: bytes, where: str) -> tuple[bytes, str]:
    """``(payload, checksum)`` of an artifact file's bytes; raises
    :class:`~fxpiece.errors.CorruptArtifactError` saying what is wrong."""
    m = _HEADER.match(data[:128])
    if m is None:
        raise CorruptArtifactError(errno.EINVAL, f"{where}: no fxpiece artifact header", where)
    payload = data[m.end() :]
    want = int(m.group(2))
    if len(payload) != want:
        raise CorruptArtifactError(
            errno.EINVAL,
            f"{where}: truncated or padded ({len(payload)} bytes, header says {want})",
            where,
        )
    got = checksum(payload)
    if got != m.group(1).decode():
        raise CorruptArtifactError(errno.EINVAL, f"{where}: checksum mismatch", where)
    return payload, got


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

    @property
    def root(self) -> Path:
        return self.layout.root

    def _handle(self, digest: str, payload_sum: str, size: int) -> dict[str, Any]:
        return {"artifact": self.layout.artifact_rel(digest), "blake3": payload_sum, "size": size}

    def read(self, digest: str) -> tuple[bytes, str] | None:
        """``(payload, checksum)`` of the stored artifact, ``None`` if there is
        none; a corrupt or hostile file is moved aside and ``None`` returned."""
        path = self.layout.artifact_path(digest)
        check = None
        if not self.trust:
            check_trusted(path.parent)

            def check(st: os.stat_result) -> None:
                check_stat(path, st, "cached artifact")

        try:
            data = read_regular(path, ARTIFACT_LIMIT + 256, check)
            return parse_artifact(data, str(path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except UntrustedCacheError:
            raise
        except CacheError:
            if not self.readonly:
                quarantine(path)
            return None

    def existing(self, digest: str) -> dict[str, Any] | None:
        """The handle of the valid artifact stored under ``digest`` (by any
        model, any process), or ``None``."""
        have = self.read(digest)
        return None if have is None else self._handle(digest, have[1], len(have[0]))

    def put(self, digest: str, payload: bytes) -> dict[str, Any]:
        """Store ``payload`` under ``digest`` unless a valid artifact is
        already there (then that one is kept), and return the handle of what
        is stored. Written temp + fsync + link (never replacing a file)."""
        if self.readonly:
            raise CacheError(errno.EROFS, "the cache is read-only", str(self.root))
        have = self.existing(digest)
        if have is not None:
            return have
        path = self.layout.artifact_path(digest)
        folder = ensure_private_dir(path.parent)
        tmp = folder / f".tmp-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(encode_artifact(payload))
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                # Another writer stored this digest first: keep theirs.
                theirs = self.read(digest)
                if theirs is not None:
                    return self._handle(digest, theirs[1], len(theirs[0]))
                os.link(tmp, path)  # theirs was corrupt and is now aside
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
        """The verified payload of the artifact a handle names, or ``None``
        (absent, corrupt: moved aside, or not what the handle recorded), so
        the piece is compiled again."""
        if not isinstance(handle, dict) or not self.layout.is_artifact_rel(handle.get("artifact")):
            return None
        digest = self.layout.digest_of_artifact(handle["artifact"])
        have = self.read(digest)
        if have is None:
            return None
        if have[1] != handle.get("blake3"):
            # Artifacts are never replaced, so this one was swapped after it
            # was recorded: move it aside so the recompile can store its own.
            if not self.readonly:
                quarantine(self.layout.artifact_path(digest))
            return None
        self.touch(self.layout.artifact_path(digest))
        return have[0]

    def touch(self, path: Path) -> None:
        """Record a use (``fxpiece cache prune`` removes least recently used first)."""
        if self.readonly:
            return
        with contextlib.suppress(OSError):  # a read-only mount: uses are not recorded
            os.utime(path, None, follow_symlinks=False)
