"""``fxpiece cache push ROOT URL`` / ``pull ROOT URL``: copy a cache root to
a remote store and back, for operators (seeding a fleet, warming a pod).

**push** reads the root without changing it (the one scan
:func:`~fxpiece.cache.admin.scan.scan_cache`, artifacts through
:meth:`ArtifactStore.read <fxpiece.cache.store.ArtifactStore.read>`, which
verifies header, length, checksum, the digest binding and the signature of
a ``v3`` file against the trusted keys). Each verified artifact becomes the
blob of its digest in its signed file form (``FXPIECE-ARTIFACT v3
digest=<hex> ... sig=<signer:signature>``, stored only if absent): a ``v3``
file travels byte for byte with its own signer; an unsigned ``v2`` file of
this root (written before ``v3``: the root passed the ownership checks, so
the local backend loads it) is signed by the pusher's builder key on the
way out, the pusher vouching for it. Then each model's index entries go
into its map, each signed (kind ``index-entry``, :func:`sign_entry`), an
entry that names an artifact only once that artifact's blob is on the
server. Anything not verified (corrupt, ``v1``, signed by a key not
trusted, missing, over the size limit) stays behind and is listed.

**pull** writes through the local store's normal paths:
each blob is checked (:func:`~fxpiece.cache.store.decode_artifact` with the
digest it was stored under: header, length, checksum, binding, and a
signature by a trusted key: unsigned ``v1``/``v2`` blobs and untrusted or
revoked signers are refused) and stored with :meth:`ArtifactStore.put
<fxpiece.cache.store.ArtifactStore.put>` keeping its signature (so ``cache
ls`` names who built it; kept if a valid one is already there); index
entries must carry a trusted ``index-entry`` signature (:func:`verify_entry`)
and go into :class:`~fxpiece.cache.model.ModelCache` indexes (without the
signature: the local index is bound by the private root), only where the
local index has no entry under that key (the local tier wins), pointing at
the artifact as stored locally. Malformed or unsigned entries and blobs
that fail their check are refused and listed. Nothing is unpickled:
payloads are bytes here.

Remote index fields are the index key as compact JSON (``[1,8,0,"inductor"]``),
values the entry as JSON (UTF-8) with its signature under ``"sig"``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxpiece.cache.admin.scan import ModelScan, model_key, scan_cache
from fxpiece.cache.entries import Entry, RawKey, UnknownKey, decode_key, decode_value
from fxpiece.cache.layout import KEY_DIR_LEN, CacheLayout
from fxpiece.cache.model import ModelCache
from fxpiece.cache.store import (
    ARTIFACT_KIND,
    ArtifactStore,
    artifact_message,
    decode_artifact,
    encode_artifact,
)
from fxpiece.cache.trust import ensure_private_dir
from fxpiece.errors import (
    BlobTooLargeError,
    ConfigError,
    CorruptArtifactError,
    SignatureError,
)
from fxpiece.hashing import hash_factors
from fxpiece.remote.base import RemoteStore
from fxpiece.signing import BuilderKey, KeyRing, TrustedKeys, verify_digest

__all__ = [
    "ENTRY_KIND",
    "PullResult",
    "PushResult",
    "decode_entry",
    "encode_entry",
    "entry_field",
    "entry_message",
    "parse_entry_field",
    "pull_cache",
    "push_cache",
    "sign_entry",
    "verify_entry",
]

ENTRY_KIND = "index-entry"
"""The signature kind of a remote index entry (:mod:`fxpiece.signing`)."""
_SIG = "sig"


def entry_field(key: RawKey) -> str:
    """The remote field of an index key.

    >>> entry_field((1, 8, 0, "inductor"))
    '[1,8,0,"inductor"]'
    """
    return json.dumps(list(key), separators=(",", ":"))


def parse_entry_field(text: str) -> RawKey | None:
    """The index key a remote field names, or ``None`` if it names none.

    >>> parse_entry_field('[1,8,0,"inductor"]'), parse_entry_field('[1,"x"]')
    ((1, 8, 0, 'inductor'), None)
    """
    try:
        k = json.loads(text)
    except ValueError:
        return None
    if (
        isinstance(k, list)
        and len(k) == 4
        and all(type(x) is int for x in k[:3])
        and isinstance(k[3], str)
    ):
        return (k[0], k[1], k[2], k[3])
    return None


def encode_entry(value: Any) -> bytes:
    """An index entry's value as stored remotely (JSON, UTF-8)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def decode_entry(raw: bytes) -> dict[str, Any] | None:
    """An index entry's value from its remote form, or ``None`` if it is not
    a JSON object."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def entry_message(model_key: str, model_tag: str, field: str, value: dict[str, Any]) -> str:
    """What a remote index entry's signature signs (64 hex):
    ``hash_factors([model key, model tag, field, value without "sig"])``,
    binding the entry to its model and index key (an entry moved to another
    model or key fails)."""
    unsigned = {k: v for k, v in value.items() if k != _SIG}
    return hash_factors([model_key, model_tag, field, unsigned])


def sign_entry(
    key: BuilderKey, model_key: str, model_tag: str, field: str, value: dict[str, Any]
) -> dict[str, Any]:
    """``value`` with its ``index-entry`` signature under ``"sig"``."""
    sig = key.sign_digest(ENTRY_KIND, entry_message(model_key, model_tag, field, value))
    return {**{k: v for k, v in value.items() if k != _SIG}, _SIG: sig.text()}


def verify_entry(
    trusted: TrustedKeys, model_key: str, model_tag: str, field: str, value: dict[str, Any]
) -> dict[str, Any]:
    """``value`` without its signature, if a trusted key signed it for this
    model, tag and field; :class:`~fxpiece.errors.SignatureError` otherwise
    (unsigned, malformed, tampered with, untrusted or revoked signer)."""
    sig = value.get(_SIG)
    if not isinstance(sig, str):
        raise SignatureError("unsigned index entry")
    verify_digest(ENTRY_KIND, entry_message(model_key, model_tag, field, value), sig, trusted)
    return {k: v for k, v in value.items() if k != _SIG}


@dataclass(frozen=True, slots=True)
class PushResult:
    """What :func:`push_cache` copied."""

    root: Path
    url: str
    models: int
    blobs_pushed: int
    blobs_present: int
    """Already on the server (the server's copy stays)."""
    bytes_pushed: int
    entries_pushed: int
    entries_present: int
    """Already on the server under the same key (left as they are)."""
    skipped: tuple[str, ...] = ()
    """What stayed behind, and why."""
    signed_here: int = 0
    """Unsigned (pre-``v3``) artifacts of the root the pusher signed on the way out."""

    @property
    def ok(self) -> bool:
        return not self.skipped

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "url": self.url,
            "models": self.models,
            "blobs_pushed": self.blobs_pushed,
            "signed_here": self.signed_here,
            "blobs_present": self.blobs_present,
            "bytes_pushed": self.bytes_pushed,
            "entries_pushed": self.entries_pushed,
            "entries_present": self.entries_present,
            "skipped": list(self.skipped),
            "ok": self.ok,
        }


@dataclass(frozen=True, slots=True)
class PullResult:
    """What :func:`pull_cache` wrote."""

    root: Path
    url: str
    models: int
    artifacts_written: int
    artifacts_present: int
    """Already in the root (a valid local one stays)."""
    bytes_written: int
    entries_written: int
    entries_present: int
    """The local index already had an entry under that key (it stays)."""
    refused: tuple[str, ...] = ()
    """What was not written, and why (failed its check, malformed, missing)."""

    @property
    def ok(self) -> bool:
        return not self.refused

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "url": self.url,
            "models": self.models,
            "artifacts_written": self.artifacts_written,
            "artifacts_present": self.artifacts_present,
            "bytes_written": self.bytes_written,
            "entries_written": self.entries_written,
            "entries_present": self.entries_present,
            "refused": list(self.refused),
            "ok": self.ok,
        }


# -- push -------------------------------------------------------------------------


@dataclass
class _Push:
    store: RemoteStore
    artifacts: ArtifactStore
    on_server: set[str] = field(default_factory=set)
    pushed: int = 0
    present: int = 0
    bytes: int = 0
    signed_here: int = 0
    skipped: list[str] = field(default_factory=list)

    def blob(self, rel: str) -> bool:
        """Put the artifact at ``rel`` on the server unless it is there;
        whether the server has it afterwards."""
        digest = CacheLayout.digest_of_artifact(rel)
        if digest in self.on_server:
            return True
        if self.store.has_blob(digest):
            self.present += 1
        else:
            art = self.artifacts.get(digest)
            if art is None:
                self.skipped.append(
                    f"{rel}: missing, corrupt, v1 (not bound to its digest) or not signed by "
                    "a trusted key"
                )
                return False
            signature = art.signature
            if signature is None:  # pre-v3, loaded from this private root: vouched for
                message = artifact_message(digest, art.checksum, len(art.payload))
                signature = self.artifacts.signer().sign_digest(ARTIFACT_KIND, message)
                self.signed_here += 1
            data = encode_artifact(art.payload, digest, signature=signature)
            try:
                if self.store.put_blob(digest, data):
                    self.pushed += 1
                    self.bytes += len(data)
                else:
                    self.present += 1
            except BlobTooLargeError as e:
                self.skipped.append(f"{rel}: {e.strerror}")
                return False
        self.on_server.add(digest)
        return True


def _push_model(push: _Push, signer: BuilderKey, m: ModelScan, key: str) -> tuple[int, int]:
    """Put each index entry of model ``m`` (full key ``key``) into its map on
    the server, signed by ``signer``, an entry naming an artifact only once
    that artifact's blob is there; (entries stored, entries already there)."""
    pushed = present = 0
    for ikey, value in m.entries:
        entry = decode_value(decode_key(ikey), value)
        if entry is None:
            push.skipped.append(f"{m.rel} {list(ikey)}: not an entry")
            continue
        if isinstance(entry, Entry) and entry.names_artifact:
            rel = entry.artifact
            if rel is None:
                push.skipped.append(f"{m.rel} {list(ikey)}: its handle points outside artifacts/")
                continue
            if not push.blob(rel):
                push.skipped.append(f"{m.rel} {list(ikey)}: its artifact stayed behind")
                continue
        fname = entry_field(ikey)
        signed = sign_entry(signer, key, m.tag, fname, value)
        try:
            stored = push.store.put_entry(m.tag, key, fname, encode_entry(signed), if_absent=True)
        except BlobTooLargeError as e:
            push.skipped.append(f"{m.rel} {list(ikey)}: {e.strerror}")
            continue
        if stored:
            pushed += 1
        else:
            present += 1
    return pushed, present


def push_cache(
    root: str | os.PathLike[str], store: RemoteStore, *, keys: KeyRing | None = None
) -> PushResult:
    """Copy every verified artifact and every index entry of the cache at
    ``root`` to ``store``, signed (see the module's docs); ``root`` is not
    changed. ``keys``: the builder key to sign with and the keys whose
    artifacts are pushed (default: this builder's). Raises
    :class:`~fxpiece.errors.RemoteUnavailableError` if the store fails
    (what was copied until then stays: every write stands alone), a
    :class:`~fxpiece.errors.CacheError` if there is no usable signing key."""
    scan = scan_cache(root)
    store.ping()  # unreachable: one error before anything is read
    push = _Push(store, ArtifactStore(scan.layout, readonly=True, keys=keys or KeyRing()))
    signer = push.artifacts.signer()  # no key: one error before anything is sent
    for path in sorted(scan.artifacts):
        push.blob(path)
    models = entries_pushed = entries_present = 0
    for m in scan.models:
        key = model_key(m)
        if len(key) <= KEY_DIR_LEN:
            push.skipped.append(
                f"{m.rel}: its factors file is missing or does not match the folder, so its "
                "full key is unknown (a run of the model rewrites it)"
            )
            continue
        models += 1
        pushed, present = _push_model(push, signer, m, key)
        entries_pushed += pushed
        entries_present += present
    return PushResult(
        scan.root,
        store.url,
        models,
        push.pushed,
        push.present,
        push.bytes,
        entries_pushed,
        entries_present,
        tuple(push.skipped),
        push.signed_here,
    )


# -- pull -------------------------------------------------------------------------


@dataclass
class _Pull:
    store: RemoteStore
    artifacts: ArtifactStore
    handles: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    written: int = 0
    present: int = 0
    bytes: int = 0
    refused: list[str] = field(default_factory=list)

    def artifact(self, digest: str) -> dict[str, Any] | None:
        """The local handle of ``digest``'s artifact, pulled if missing;
        ``None`` if it is neither here nor a blob that passes its check."""
        if digest in self.handles:
            return self.handles[digest]
        handle = self.artifacts.existing(digest)
        if handle is not None:
            self.present += 1
        else:
            handle = self._fetch(digest)
        self.handles[digest] = handle
        return handle

    def _fetch(self, digest: str) -> dict[str, Any] | None:
        where = f"{self.store.url} blob {digest[:16]}.."
        try:
            data = self.store.get_blob(digest)
        except BlobTooLargeError as e:
            self.refused.append(f"{where}: {e.strerror}")
            return None
        if data is None:
            self.refused.append(f"{where}: not on the server")
            return None
        try:
            art = decode_artifact(
                data, where, digest, trusted=self.artifacts.trusted_keys(), unsigned_ok=False
            )
        except CorruptArtifactError as e:
            self.refused.append(e.strerror or str(e))
            return None
        del data
        if art.digest is None:
            self.refused.append(f"{where}: a v1 artifact (not bound to its digest)")
            return None
        try:
            handle = self.artifacts.put(digest, art.payload, signature=art.signature)
        except CorruptArtifactError as e:
            self.refused.append(e.strerror or str(e))
            return None
        self.written += 1
        self.bytes += len(art.payload)
        return handle


def _pull_model(
    pull: _Pull, mc: ModelCache, key: str, tag: str, entries: dict[str, bytes]
) -> tuple[int, int]:
    label = f"{pull.store.url} {mc.folder.parent.name}/{mc.folder.name}"
    trusted = pull.artifacts.trusted_keys()
    mc.index.refresh()
    batch: dict[RawKey, Any] = {}
    present = 0
    for fname in sorted(entries):
        ikey = parse_entry_field(fname)
        value = decode_entry(entries[fname])
        if ikey is None or value is None or isinstance(decode_key(ikey), UnknownKey):
            pull.refused.append(f"{label}: entry {fname[:80]!r} is malformed")
            continue
        if ikey in mc.index:
            present += 1
            continue
        try:
            value = verify_entry(trusted, key, tag, fname, value)
        except SignatureError as e:
            pull.refused.append(f"{label} {fname}: {e}")
            continue
        typed = decode_value(decode_key(ikey), value)
        if typed is None:
            pull.refused.append(f"{label} {fname}: not an index entry")
            continue
        if isinstance(typed, Entry) and typed.names_artifact:
            rel = typed.artifact
            if rel is None:
                pull.refused.append(f"{label} {fname}: its handle points outside artifacts/")
                continue
            local = pull.artifact(CacheLayout.digest_of_artifact(rel))
            if local is None:
                pull.refused.append(f"{label} {fname}: its artifact was refused")
                continue
            # The artifact as stored here (a valid local one of the same
            # digest stays, and may be another compile of the same meaning).
            value = {**value, "handle": local}
        batch[ikey] = value
    if batch:
        mc.index.update(batch)
    return len(batch), present


def pull_cache(
    root: str | os.PathLike[str], store: RemoteStore, *, keys: KeyRing | None = None
) -> PullResult:
    """Copy every signed, trusted blob and index entry of ``store`` into the
    cache at ``root`` (created private if missing) through the store's
    checked writes (see the module's docs). ``keys``: whose signatures are
    accepted (default: :func:`~fxpiece.signing.trusted_keys`). Raises
    :class:`~fxpiece.errors.RemoteUnavailableError` if the store fails
    (what was written until then is complete and valid)."""
    store.ping()  # unreachable: one error before anything is created
    layout = CacheLayout(ensure_private_dir(Path(root).expanduser()))
    ring = keys or KeyRing()
    pull = _Pull(store, ArtifactStore(layout, keys=ring))
    pull.artifacts.trusted_keys()  # unreadable trust: one error before anything is written
    models = written = present = 0
    for tag, key in store.models():
        try:
            if len(key) <= KEY_DIR_LEN:
                raise ConfigError("key", "a prefix, not a whole cache key")
            mc = ModelCache(layout, key, tag, keys=ring)
        except ConfigError as e:
            pull.refused.append(f"{store.url} model {key[:16]}../{tag[:40]!r}: {e}")
            continue
        w, p = _pull_model(pull, mc, key, tag, store.entries(tag, key))
        models += 1
        written += w
        present += p
    for digest in _sorted(store.blob_digests()):
        pull.artifact(digest)
    return PullResult(
        layout.root,
        store.url,
        models,
        pull.written,
        pull.present,
        pull.bytes,
        written,
        present,
        tuple(pull.refused),
    )


def _sorted(digests: Iterable[str]) -> list[str]:
    return sorted(set(digests))
