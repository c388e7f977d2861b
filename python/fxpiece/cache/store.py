"""The content-addressed artifact store: write-once, self-verifying.

An artifact lives at ``artifacts/<2 hex>/<digest>`` (see
:class:`~fxpiece.cache.layout.CacheLayout`); the digest names what the
artifact *means* (:func:`fxpiece.cache.keys.artifact_digest`). The file is

    FXPIECE-ARTIFACT v2 digest=<hex> blake3=<hex> len=<n>\\n<payload>

or, since ``v3``, signed by the builder that wrote it::

    FXPIECE-ARTIFACT v3 digest=<hex> blake3=<hex> len=<n> sig=ed25519:<key>:<sig>\\n<payload>

so any reader can check it on its own: ``blake3`` is the checksum of the
payload (also kept in the index handle), ``digest`` the digest it was
stored under and ``sig`` (see :mod:`fxpiece.signing`) an Ed25519 signature
of kind ``artifact`` over ``hash_factors(["artifact", digest, blake3, len])``
(:func:`artifact_message`): it binds the payload, its length and the digest
it is stored under, and names its signer. A reader verifies it from the
checked header alone (no second pass over the payload) and then asks its
:class:`~fxpiece.signing.TrustedKeys` whether the signer is trusted.

Which files load (:class:`ArtifactStore`): a ``v3`` file whose signature
verifies and whose signer is trusted (not revoked); an unsigned ``v1`` or
``v2`` file (written before ``v3``) only from a root that passed the
ownership checks of :mod:`fxpiece.cache.trust` (``accept_unsigned``
defaults to ``not trust``: a shared root opened with
``allow_untrusted_cache`` loads signed files only). Anything refused is
moved aside like a corrupt file (its index entries go with it: reported
once) and rebuilt. The remote tier (:mod:`fxpiece.remote.sync`) and ``cache
unpack`` accept signed, trusted files only.

Every read checks the digest a header records against the path the file was
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
import logging
import os
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxpiece import _native
from fxpiece.cache.entries import handle_artifact
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.safeio import open_regular, read_exact
from fxpiece.cache.trust import check_stat, check_trusted, ensure_private_dir
from fxpiece.errors import (
    BadSignatureError,
    CacheError,
    ConfigError,
    CorruptArtifactError,
    KeyFileError,
    SignatureError,
    UntrustedCacheError,
)
from fxpiece.hashing import hash_factors
from fxpiece.signing import BuilderKey, KeyRing, PublicKey, Signature, TrustedKeys

__all__ = [
    "ARTIFACT_KIND",
    "ARTIFACT_LIMIT",
    "Artifact",
    "ArtifactSignatureError",
    "ArtifactStore",
    "artifact_message",
    "check_artifact_signer",
    "checksum",
    "decode_artifact",
    "encode_artifact",
    "make_durable",
    "parse_artifact",
    "quarantine",
    "read_header",
]

_log = logging.getLogger("fxpiece")

ARTIFACT_KIND = "artifact"
"""The signature kind of an artifact (:mod:`fxpiece.signing`)."""

ARTIFACT_LIMIT = 4 << 30
"""Largest artifact read (bytes); anything bigger under ``artifacts/`` is hostile."""
_HEADER = re.compile(
    rb"^FXPIECE-ARTIFACT (?:v1|v(?P<v>[23]) digest=(?P<digest>[0-9a-f]{1,128})) "
    rb"blake3=(?P<sum>[0-9a-f]{64}) len=(?P<len>\d{1,20})"
    rb"(?: sig=(?P<sig>[A-Za-z0-9:_-]{1,200}))?\n"
)
_DIGEST = re.compile(r"[0-9a-f]{1,128}")


def checksum(payload: bytes | bytearray | memoryview) -> str:
    """The BLAKE3 checksum of an artifact's payload (kept in its header and
    in index handles): ``hash_factors(bytes(payload))``, computed over the
    buffer itself (no copy, GIL released)."""
    return _native.checksum(payload)


class ArtifactSignatureError(CorruptArtifactError):
    """An artifact refused for its signature: unsigned where a signature is
    required, a signature that does not verify (payload, length or digest
    changed after signing), or a signer that is not trusted or revoked.
    ``signer`` is the signer's text form when there is one."""

    signer: str | None = None


def artifact_message(digest: str, payload_sum: str, size: int) -> str:
    """What an artifact's signature signs (as a 32-byte digest, 64 hex):
    ``hash_factors(["artifact", digest, blake3, len])``, binding the payload
    (by its checksum), its length and the digest it is stored under."""
    return hash_factors([ARTIFACT_KIND, digest, payload_sum, size])


def _check_digest(digest: str) -> None:
    if not _DIGEST.fullmatch(digest):
        raise ValueError(f"an artifact digest is 1-128 lowercase hex digits, not {digest!r}")


def _head(digest: str | None, payload_sum: str, size: int, sig: Signature | None) -> bytes:
    if digest is None:
        return b"FXPIECE-ARTIFACT v1 blake3=%s len=%d\n" % (payload_sum.encode(), size)
    _check_digest(digest)
    if sig is None:
        return b"FXPIECE-ARTIFACT v2 digest=%s blake3=%s len=%d\n" % (
            digest.encode(),
            payload_sum.encode(),
            size,
        )
    return b"FXPIECE-ARTIFACT v3 digest=%s blake3=%s len=%d sig=%s\n" % (
        digest.encode(),
        payload_sum.encode(),
        size,
        sig.text().encode(),
    )


def encode_artifact(
    payload: bytes | bytearray | memoryview,
    digest: str | None = None,
    *,
    key: BuilderKey | None = None,
    signature: Signature | None = None,
) -> bytes:
    """The file bytes of an artifact stored under ``digest``: ``v3`` signed
    by ``key`` (or carrying ``signature``, one made earlier for this very
    payload and digest: re-encoding a verified artifact gives its bytes
    back); with neither, the unsigned legacy ``v2`` form, and without a
    digest the ``v1`` form (neither is written by the store any more: they
    are what earlier caches hold)."""
    payload_sum = checksum(payload)
    if digest is None and (key is not None or signature is not None):
        raise ValueError("a signed artifact is bound to a digest")
    if key is not None and digest is not None:
        signature = key.sign_digest(
            ARTIFACT_KIND, artifact_message(digest, payload_sum, len(payload))
        )
    return _head(digest, payload_sum, len(payload), signature) + bytes(payload)


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
    signature: Signature | None = None
    """``v3``: the signature, verified against the header (payload checksum,
    length, digest); whether its signer is trusted is the reader's question
    (:func:`check_artifact_signer`). ``None``: an unsigned ``v1``/``v2`` file."""

    @property
    def signer(self) -> PublicKey | None:
        return None if self.signature is None else self.signature.signer


def check_artifact_signer(
    art: Artifact, trusted: TrustedKeys, where: str, *, unsigned_ok: bool = False
) -> None:
    """Refuse (:class:`ArtifactSignatureError`) an artifact whose signer
    ``trusted`` does not trust (or revoked), or an unsigned one unless
    ``unsigned_ok``. The signature itself was verified when it was read."""
    if art.signature is None:
        if not unsigned_ok:
            raise _sig_error(
                where,
                "unsigned (written before v3, or by a writer without a key): refused "
                "where only signed artifacts are accepted",
                None,
            )
        return
    try:
        trusted.check(art.signature.signer)
    except SignatureError as e:
        raise _sig_error(where, str(e), str(art.signature.signer)) from None


def _sig_error(where: str, why: str, signer: str | None) -> ArtifactSignatureError:
    e = ArtifactSignatureError(errno.EACCES, f"{where}: {why}", where)
    e.signer = signer
    return e


def decode_artifact(
    data: bytes | bytearray,
    where: str,
    digest: str | None = None,
    *,
    trusted: TrustedKeys | None = None,
    unsigned_ok: bool = True,
) -> Artifact:
    """Verify an artifact file's bytes (header, length, checksum, the
    signature of a ``v3`` file and, when ``digest`` names the digest it was
    found under, that its header records that very digest); with
    ``trusted``, also that its signer is trusted (unsigned files refused
    unless ``unsigned_ok``). Raises :class:`~fxpiece.errors.CorruptArtifactError`
    (:class:`ArtifactSignatureError` for a signature) saying what is wrong."""
    m = _header(data[:_HEAD_MAX], where)
    payload = data[m.end() :]
    del data  # a caller's only reference: freed once sliced
    _check_length(m, len(payload), where)
    art = _verified(m, payload, where, digest)
    if trusted is not None:
        check_artifact_signer(art, trusted, where, unsigned_ok=unsigned_ok)
    return art


_HEAD_MAX = 512
"""Longest possible artifact header line (a ``v3`` one: 27 + 128 digest + 8 +
64 checksum + 5 + 20 length + 5 + 200 signature + 1 = 458 bytes)."""


def _header(head: bytes | bytearray, where: str) -> re.Match[bytes]:
    m = _HEADER.match(head)
    if m is None or (m.group("v") == b"3") != (m.group("sig") is not None):
        raise CorruptArtifactError(errno.EINVAL, f"{where}: no fxpiece artifact header", where)
    return m


def read_header(path: Path, check: Callable[[os.stat_result], None] | None = None) -> Artifact:
    """What the header of the artifact file at ``path`` claims (payload
    neither read nor checked: an empty ``payload``, the recorded checksum,
    digest and signature, the signature *not* verified): for listings."""
    where = str(path)
    with open_regular(path, ARTIFACT_LIMIT + _HEAD_MAX, check) as (fd, _st):
        m = _header(os.pread(fd, _HEAD_MAX, 0), where)
    sig = m.group("sig")
    try:
        signature = None if sig is None else Signature.parse(sig.decode())
    except BadSignatureError as e:
        raise CorruptArtifactError(errno.EINVAL, f"{where}: {e}", where) from None
    bound = m.group("digest")
    return Artifact(
        b"", m.group("sum").decode(), None if bound is None else bound.decode(), signature
    )


def _check_length(m: re.Match[bytes], have: int, where: str) -> None:
    want = int(m.group("len"))
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
    if got != m.group("sum").decode():
        raise CorruptArtifactError(errno.EINVAL, f"{where}: checksum mismatch", where)
    bound = None if m.group("digest") is None else m.group("digest").decode()
    if digest is not None and bound is not None and bound != digest:
        raise CorruptArtifactError(
            errno.EINVAL,
            f"{where}: stored under digest {digest[:16]}.. but written for {bound[:16]}.. "
            "(moved or copied from another digest's path)",
            where,
        )
    signature = None
    if m.group("sig") is not None and bound is not None:
        signature = _verified_signature(m.group("sig").decode(), bound, got, len(payload), where)
    return Artifact(payload, got, bound, signature)


def _verified_signature(
    text: str, digest: str, payload_sum: str, size: int, where: str
) -> Signature:
    """The header's signature, checked against what it binds (by the checked
    checksum: no second pass over the payload); trust is checked apart."""
    try:
        sig = Signature.parse(text)
    except BadSignatureError as e:
        raise _sig_error(where, str(e), None) from None
    message = bytes.fromhex(artifact_message(digest, payload_sum, size))
    if not _native.verify_signature_digest(sig.signer.raw, ARTIFACT_KIND, message, sig.value):
        raise _sig_error(
            where,
            f"bad signature by {sig.signer.short}: the payload, its length or the digest it "
            "is stored under changed after it was signed",
            str(sig.signer),
        )
    return sig


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
        payload = read_exact(fd, int(m.group("len")), m.end(), path)
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


def make_durable(paths: Iterable[Path]) -> list[str]:
    """fsync each file, then each folder holding one: what
    :meth:`ArtifactStore.put` with ``durable=False`` left to do, in one call
    that releases the GIL once (a thread doing it never convoys with the
    main one). Never follows a symlink nor opens a FIFO; a file gone since
    (moved aside, pruned) is skipped. ``"<path>: <reason>"`` for each entry
    that could not be made durable."""
    return _native.sync_files([str(p) for p in paths])


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
    keys: KeyRing = field(default_factory=KeyRing, compare=False, repr=False)
    """The builder key :meth:`put` signs with and the keys loads trust, each
    loaded on first need (``KeyRing(signer, trusted)`` to give them; share
    one ring between the stores of one process to load them once)."""
    accept_unsigned: bool | None = None
    """Load unsigned ``v1``/``v2`` files (written before ``v3``). ``None``:
    only from a root that passed the ownership checks (``not trust``)."""

    @property
    def unsigned_ok(self) -> bool:
        return (not self.trust) if self.accept_unsigned is None else self.accept_unsigned

    def trusted_keys(self) -> TrustedKeys:
        """The ring's trusted keys; a trusted-keys configuration that cannot
        be read (unsafe file, malformed key) is an
        :class:`~fxpiece.errors.UntrustedCacheError` naming it: without it no
        signed artifact can be checked, and none is moved aside for it."""
        try:
            return self.keys.trusted()
        except (KeyFileError, ConfigError) as e:
            raise UntrustedCacheError(
                errno.EACCES,
                f"cannot read the trusted signing keys, so no signed artifact can be checked: {e}",
                str(self.root),
            ) from e

    def signer(self) -> BuilderKey:
        """The ring's builder key; one that cannot be loaded or made is a
        :class:`~fxpiece.errors.CacheError` (a store that cannot sign stores
        nothing: the piece is used in memory, as with a full disk)."""
        try:
            return self.keys.signer()
        except (KeyFileError, ConfigError) as e:
            raise CacheError(
                e.errno if isinstance(e, OSError) and e.errno else errno.EACCES,
                f"cannot sign artifacts: {e}",
                str(self.root),
            ) from e

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
            art = read_artifact(path, digest, check)
            if art.signature is not None or not self.unsigned_ok:
                check_artifact_signer(
                    art, self.trusted_keys(), str(path), unsigned_ok=self.unsigned_ok
                )
            return art
        except (FileNotFoundError, NotADirectoryError):
            return None
        except UntrustedCacheError:
            raise
        except CacheError as e:
            if isinstance(e, ArtifactSignatureError):
                _log.warning("fxpiece: refused a cached artifact, moved aside: %s", e.strerror)
            self.quarantine(digest)
            if isinstance(e, CorruptArtifactError):
                return e
            return CorruptArtifactError(e.errno or errno.EINVAL, e.strerror or str(e), str(path))

    def get(self, digest: str) -> Artifact | None:
        """The verified artifact stored under ``digest`` (bound to it: not a
        ``v1`` file), with its signature, or ``None`` (see :meth:`read`)."""
        have = self._read(digest)
        return have if isinstance(have, Artifact) and have.digest is not None else None

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

    def put(
        self,
        digest: str,
        payload: bytes | bytearray | memoryview,
        *,
        signature: Signature | None = None,
        durable: bool = True,
    ) -> dict[str, Any]:
        """Store ``payload`` under ``digest`` (``v3``, signed by the ring's
        builder key) unless a valid artifact is already there (then that one
        is kept), and return the handle of what is stored. Written temp +
        fsync + link (never replacing a file).

        ``durable=False``: no fsync of the file nor of its folder; the
        caller makes it durable later (:func:`make_durable`, off the
        critical path). A killed process loses nothing either way (the
        page cache outlives it); a power cut before that may leave the file
        missing or torn, which its checksum finds on the next read (moved
        aside with its index entries, so the piece is fetched or compiled
        again): for copies that can be fetched again, like the remote
        tier's pulls.

        ``signature``: store it with another builder's signature (an
        artifact pulled from the remote tier keeps its signer); it must
        verify for this payload and digest and its signer be trusted, else
        :class:`ArtifactSignatureError` and nothing is written."""
        if self.readonly:
            raise CacheError(errno.EROFS, "the cache is read-only", str(self.root))
        _check_digest(digest)
        payload_sum = checksum(payload)
        message = artifact_message(digest, payload_sum, len(payload))
        if signature is None:
            signature = self.signer().sign_digest(ARTIFACT_KIND, message)
        else:
            self._check_foreign_signature(digest, payload_sum, message, signature)
        return self._store(digest, payload, payload_sum, signature, durable=durable)

    def put_decoded(self, art: Artifact, *, durable: bool = True) -> dict[str, Any]:
        """:meth:`put` an artifact as :func:`decode_artifact` returned it,
        called with the digest it was fetched under and with
        ``trusted=self.trusted_keys()``, ``unsigned_ok=False``: its checksum
        and signature were just checked, so they are not computed again.
        One not bound to a digest or unsigned is a
        :class:`~fxpiece.errors.CorruptArtifactError`."""
        if self.readonly:
            raise CacheError(errno.EROFS, "the cache is read-only", str(self.root))
        if art.digest is None or art.signature is None:
            raise CorruptArtifactError(
                errno.EINVAL, "an unsigned or unbound artifact is not stored as decoded"
            )
        _check_digest(art.digest)
        return self._store(art.digest, art.payload, art.checksum, art.signature, durable=durable)

    def _store(
        self,
        digest: str,
        payload: bytes | bytearray | memoryview,
        payload_sum: str,
        signature: Signature,
        *,
        durable: bool,
    ) -> dict[str, Any]:
        head = _head(digest, payload_sum, len(payload), signature)
        have = self._keep_or_clear(digest)
        if have is not None:
            return have
        theirs = self._write_new(digest, head, payload, durable=durable)
        return theirs if theirs is not None else self._handle(digest, payload_sum, len(payload))

    def _check_foreign_signature(
        self, digest: str, payload_sum: str, message: str, signature: Signature
    ) -> None:
        """:class:`ArtifactSignatureError` unless ``signature`` is this
        payload's and its signer is trusted."""
        where = f"artifact {digest[:16]}.."
        raw = bytes.fromhex(message)
        if not _native.verify_signature_digest(
            signature.signer.raw, ARTIFACT_KIND, raw, signature.value
        ):
            raise _sig_error(where, "the signature is not this payload's", None)
        check_artifact_signer(
            Artifact(b"", payload_sum, digest, signature), self.trusted_keys(), where
        )

    def _write_new(
        self,
        digest: str,
        head: bytes,
        payload: bytes | bytearray | memoryview,
        *,
        durable: bool,
    ) -> dict[str, Any] | None:
        """Temp + fsync + link (no fsync unless ``durable``). ``None`` once
        written; the handle of a valid artifact another writer linked first
        (it is kept)."""
        path = self.layout.artifact_path(digest)
        folder = ensure_private_dir(path.parent)
        tmp = folder / f".tmp-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                for part in (head, payload):  # the payload is never copied
                    view = memoryview(part).cast("B")
                    while view:
                        view = view[os.write(fd, view) :]
                if durable:
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
            if durable:
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
        return None

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
        rel = handle_artifact(handle)
        if rel is None:
            return None
        digest = self.layout.digest_of_artifact(rel)
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
