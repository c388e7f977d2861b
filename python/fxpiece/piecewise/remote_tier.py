"""The remote cache tier in the compile path: a
:class:`~fxpiece.piecewise.coordination.Coordination` that wraps the local
one (:class:`~fxpiece.piecewise.coordination.SharedFolder` by default) and
shares a fleet's compiles through a :class:`~fxpiece.remote.RemoteStore`
(``CompileConfig.remote_cache``, e.g. ``redis://host:6379/0``).

The local root stays the first tier; the store is the second, by the same
digests and index keys as ``fxpiece cache push/pull``
(:mod:`fxpiece.remote.sync`):

- **pull on a local miss.** Before a graph's pieces are loaded (and before
  an ahead-of-time start reads its launch folder), when the local index
  lacks any of them (a piece identical to an indexed one is not missing),
  the model's remote index entries are read in one request and the blobs
  they name at once; each must carry a trusted ``index-entry`` signature,
  name its artifact by its digest's path, and its artifact's blob must
  decode with a trusted signature (:func:`~fxpiece.cache.store.decode_artifact`,
  ``unsigned_ok=False``). What passes is stored in the local root (keeping
  its signer) and loads like a local entry; anything unsigned, untrusted,
  revoked, malformed or corrupt is refused (``num_untrusted_remote``, one
  warning) and compiled here.
- **push once built.** A compiled piece's artifact, its kernel bundle and
  their index entries (signed by this builder), the model's kernel bundle
  and ahead-of-time entries are pushed as soon as they are recorded, before
  the compile lease is released.
- **one compile per fleet.** The compile lease of a digest is taken on the
  store (after the local one, so one process per host asks), with an expiry,
  renewed while compiling; a process that finds it taken polls the store for
  the result and loads it. Compile slots stay per machine: this machine's
  folder in ``/dev/shm`` (the roots are private, the cores are shared).
- **the store failing** (down, slow, full: bounded by
  :class:`~fxpiece.remote.RemoteConfig`'s timeouts) is one warning and
  ``num_remote_errors``; from then on this backend uses the local strategy
  alone (a full store only stops the pushes). Never a hang, never a wrong
  answer: nothing from the store is used unverified.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fxpiece.cache.entries import (
    MODEL_KERNELS,
    Entry,
    IndexKey,
    PieceKey,
    UnknownKey,
    Unsupported,
    Value,
    decode_key,
    decode_value,
)
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.lease import Releasable, WaitOutcome
from fxpiece.cache.model import ModelCache
from fxpiece.cache.slots import host_slot_base, host_slot_dir
from fxpiece.cache.store import (
    ARTIFACT_KIND,
    artifact_message,
    decode_artifact,
    encode_artifact,
    make_durable,
)
from fxpiece.errors import (
    BlobTooLargeError,
    CacheError,
    CorruptArtifactError,
    RemoteUnavailableError,
    SignatureError,
)
from fxpiece.piecewise.coordination import Coordination
from fxpiece.piecewise.kernel_cache import KernelCache
from fxpiece.piecewise.plan import Work
from fxpiece.remote.base import Lease as RemoteLease
from fxpiece.remote.base import RemoteStore, check_model
from fxpiece.remote.sync import (
    decode_entry,
    encode_entry,
    entry_field,
    parse_entry_field,
    sign_entry,
    verify_entry,
)

if TYPE_CHECKING:
    from fxpiece.piecewise.resolver import Resolver

__all__ = ["RemoteTier"]

_log = logging.getLogger("fxpiece")

_POLL_MIN = 0.05
_POLL_MAX = 0.2
"""Seconds between two looks at the store while another host compiles."""
_PULLERS = 4
"""Pulled blobs checked and written at once."""


def _no_count(name: str) -> None:
    """The default counter: counts nothing."""


class _Held:
    """A local lease plus the store's lease on the same digest, renewed by a
    daemon thread until :meth:`release` (which releases both)."""

    def __init__(self, tier: RemoteTier, local: Releasable, lease: RemoteLease) -> None:
        self._tier = tier
        self._local = local
        self._lease = lease
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"fxpiece-remote-{lease.name[:24]}", daemon=True
        )
        self._thread.start()

    def _heartbeat(self) -> None:
        period = max(0.05, self._lease.ttl / 3)
        while not self._stop.wait(period):
            try:
                if not self._tier.store.renew_lease(self._lease):
                    return  # expired (and maybe taken): the worst is a second compile
            except RemoteUnavailableError as e:
                self._tier.unavailable(e)
                return

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            if not self._tier.down:
                self._tier.store.release_lease(self._lease)
        except RemoteUnavailableError as e:
            self._tier.unavailable(e)
        finally:
            self._local.release()


class RemoteTier:
    """``local`` coordination plus a remote ``store`` (see the module's
    docs). ``count`` adds to the backend's counters."""

    def __init__(
        self,
        local: Coordination,
        store: RemoteStore,
        *,
        count: Callable[[str], None] = _no_count,
    ) -> None:
        self.local = local
        self.store = store
        self.aot_unsupported: str | None = local.aot_unsupported
        self._count = count
        self._lock = threading.Lock()
        self._down: str | None = None
        """Why the store is not used any more (``None``: it is)."""
        self._no_writes: str | None = None
        """Why nothing is pushed any more (the store is full)."""
        self._warned_refused = False
        self._pushed: set[str] = set()
        """Digests of the blobs on the store (pushed or pulled here)."""
        self._kernels: KernelCache | None = None
        """The resolver's kernel bundles (known from :meth:`before`): what a
        wait pulls is unpacked before the piece loads."""
        self._syncs: list[threading.Thread] = []
        """The threads making pulled artifacts durable (see :meth:`_pull_artifacts`)."""

    # -- the store failing ----------------------------------------------------
    @property
    def down(self) -> bool:
        return self._down is not None

    def unavailable(self, e: RemoteUnavailableError) -> None:
        """The store failed: warn once, count, and use the local strategy
        alone from now on (a full store: stop pushing only)."""
        why = e.strerror or str(e)
        with self._lock:
            if e.errno == errno.ENOSPC:
                first = self._no_writes is None and self._down is None
                self._no_writes = why
            else:
                first = self._down is None and self._no_writes is None
                self._down = why
        self._count("num_remote_errors")
        if first:
            _log.warning(
                "fxpiece: %s; %s",
                why,
                "nothing more is pushed to it"
                if e.errno == errno.ENOSPC
                else "using the local cache only from now on (compiling what it lacks)",
            )

    def _refused(self, what: str) -> None:
        """Something from the store that no trusted key signed, or that fails
        its check: counted, warned once, never used."""
        self._count("num_untrusted_remote")
        with self._lock:
            first, self._warned_refused = not self._warned_refused, True
        if first:
            _log.warning(
                "fxpiece: refused from the remote cache %s: %s; compiling it here "
                "(further refusals are counted in num_untrusted_remote)",
                self.store.url,
                what,
            )

    @staticmethod
    def _model(mc: ModelCache) -> tuple[str, str] | None:
        """``(model tag, key)`` of ``mc`` as the store names it, if it can."""
        tag = mc.folder.name
        try:
            check_model(tag, mc.key)
        except ValueError:
            return None
        return tag, mc.key

    # -- Coordination -----------------------------------------------------------
    def slot_folder(self, mc: ModelCache | None) -> tuple[Path, Path] | None:
        """This machine's slots (``/dev/shm``, as for
        :class:`~fxpiece.distributed.Collectives`): a fleet's processes have
        private roots, and those on one machine share its cores. ``None``
        (unbounded) where the local strategy has none."""
        if self.local.slot_folder(mc) is None:
            return None
        return host_slot_base(), host_slot_dir()

    def try_lease(self, mc: ModelCache, digest: str, ttl: float) -> Releasable | None:
        lease = self.local.try_lease(mc, digest, ttl)
        if lease is None or self.down:
            return lease
        try:
            held = self.store.acquire_lease(_lease_name(digest), ttl)
        except RemoteUnavailableError as e:
            self.unavailable(e)
            return lease
        if held is None:  # another host compiles it: the second pass waits for it
            lease.release()
            return None
        # Finished elsewhere between our miss and our lease: the resolver's
        # next look at the local cache finds it.
        self._pull_result(mc, digest)
        return _Held(self, lease, held)

    def lease_or_wait(
        self,
        mc: ModelCache,
        digest: str,
        *,
        ttl: float,
        timeout: float,
        poll: Callable[[], Callable[..., Any] | None],
    ) -> WaitOutcome[Callable[..., Any]]:
        t0 = time.monotonic()
        outcome = self.local.lease_or_wait(mc, digest, ttl=ttl, timeout=timeout, poll=poll)
        if outcome.lease is None or self.down:
            return outcome
        local = outcome.lease
        delay = _POLL_MIN
        while True:
            try:
                held = self.store.acquire_lease(_lease_name(digest), ttl)
            except RemoteUnavailableError as e:
                self.unavailable(e)
                return outcome  # the local lease: compile here
            waited = time.monotonic() - t0
            if held is not None:
                self._pull_result(mc, digest)  # finished meanwhile: polled next
                # Taken at the first try: nobody was waited for.
                waited = outcome.waited_s if delay == _POLL_MIN else waited
                return WaitOutcome(_Held(self, local, held), None, waited)
            result = poll() if self._pull_result(mc, digest) else None
            if result is not None:
                local.release()
                return WaitOutcome(None, result, time.monotonic() - t0)
            if self.down:  # failed while waiting: compile here
                return WaitOutcome(local, None, waited)
            if waited >= timeout:
                local.release()
                return WaitOutcome(None, None, waited)
            time.sleep(min(delay, max(0.0, timeout - waited)))
            delay = min(delay * 2, _POLL_MAX)

    def before(self, resolver: Resolver, work: Sequence[Work], mc: ModelCache | None) -> None:
        """Pull the model's entries when the local index lacks any of
        ``work`` (and unpack the kernel bundles pulled), then the local
        strategy's step."""
        self._kernels = resolver.kernels
        if mc is not None:
            # A piece identical to an indexed one (another layer) loads from it.
            have = {w.digest for w in work if _has(mc, w)}
            missing = [w.key for w in work if w.digest not in have]
            if missing and self.fetch(mc, missing):
                resolver.kernels.restore(mc)
        self.local.before(resolver, work, mc)

    def fetch(self, mc: ModelCache, keys: Sequence[IndexKey]) -> bool:
        """Pull the model's remote entries the local index lacks (one
        request), each verified, with their artifacts (see the module's
        docs). Whether anything was stored."""
        return bool(keys) and self._fetch_model(mc)

    def _fetch_model(self, mc: ModelCache) -> bool:
        if mc.readonly or self.down:
            return False
        model = self._model(mc)
        if model is None:
            return False
        tag, key = model
        try:
            raw = self.store.entries(tag, key)
        except BlobTooLargeError as e:
            self._refused(e.strerror or str(e))
            return False
        except RemoteUnavailableError as e:
            self.unavailable(e)
            return False
        got = self._verified_entries(mc, tag, key, raw)
        if not got:
            return False
        try:
            mc.entries.put_many(got)
        except CacheError as e:
            _log.warning("fxpiece: could not record entries pulled from the remote cache: %s", e)
            return False
        return True

    def publish(self, mc: ModelCache, keys: Sequence[IndexKey]) -> None:
        """Push the entries at ``keys`` (recorded here just now), each after
        its artifact, signed by this builder."""
        if mc.readonly or self.down or self._no_writes is not None:
            return
        model = self._model(mc)
        if model is None:
            return
        tag, key = model
        try:
            signer = mc.artifacts.signer()
        except CacheError as e:
            _log.warning("fxpiece: nothing pushed to the remote cache: %s", e)
            return
        for k in keys:
            value = mc.entries.value(k)
            if value is None:
                continue
            if isinstance(value, Entry):
                if value.artifact != _artifact_rel(value.digest):
                    continue  # a handle no other host could load
                if not self._push_blob(mc, value.digest):
                    continue
            signed = sign_entry(signer, key, tag, entry_field(k.to_raw()), value.to_raw())
            try:
                self.store.put_entry(
                    tag,
                    key,
                    entry_field(k.to_raw()),
                    encode_entry(signed),
                    if_absent=k != MODEL_KERNELS,  # the model's bundle: the latest stays
                )
            except BlobTooLargeError as e:
                _log.warning("fxpiece: not pushed to the remote cache: %s", e.strerror)
            except RemoteUnavailableError as e:
                self.unavailable(e)
                return

    # -- pulling -----------------------------------------------------------------
    def _verified_entries(
        self, mc: ModelCache, tag: str, key: str, raw: dict[str, bytes]
    ) -> list[tuple[IndexKey, Value]]:
        """The remote entries the local index lacks that a trusted key signed
        for this model, with their artifacts stored here."""
        trusted = mc.artifacts.trusted_keys()
        out: list[tuple[IndexKey, Value]] = []
        entries: list[tuple[IndexKey, Entry]] = []
        for fname in sorted(raw):
            rk = parse_entry_field(fname)
            ik = None if rk is None else decode_key(rk)
            if ik is None or isinstance(ik, UnknownKey):
                continue  # another schema's entry: not ours to read
            if mc.entries.value(ik) is not None:
                continue  # the local tier wins
            signed = decode_entry(raw[fname])
            if signed is None:
                self._refused(f"entry {fname[:80]} of {tag} is malformed")
                continue
            try:
                plain = verify_entry(trusted, key, tag, fname, signed)
            except SignatureError as e:
                self._refused(f"entry {fname[:80]} of {tag}: {e}")
                continue
            value = decode_value(ik, plain)
            if isinstance(value, Unsupported):
                out.append((ik, value))
                continue
            if value is None or value.artifact != _artifact_rel(value.digest):
                self._refused(f"entry {fname[:80]} of {tag} does not name its digest's artifact")
                continue
            entries.append((ik, value))
        handles = self._pull_artifacts(mc, sorted({entry.digest for _, entry in entries}))
        for ik, entry in entries:
            handle = handles.get(entry.digest)
            if handle is not None:
                out.append((ik, Entry(entry.digest, handle, entry.files)))
        return out

    def _pull_artifacts(self, mc: ModelCache, digests: list[str]) -> dict[str, dict[str, Any]]:
        """The local handles of ``digests``' artifacts: the ones here, and the
        rest pulled from the store at once (see
        :meth:`~fxpiece.remote.RemoteStore.get_blobs`) and stored here if
        each passes every check."""
        handles: dict[str, dict[str, Any]] = {}
        missing = []
        for d in digests:
            have = mc.artifacts.existing(d)
            if have is not None:
                handles[d] = have
            else:
                missing.append(d)
        if not missing or self.down or mc.readonly:
            return handles
        try:
            blobs = self.store.get_blobs(missing)
        except RemoteUnavailableError as e:
            self.unavailable(e)
            return handles
        except ValueError:
            return handles  # not digests the store can name
        # Checked and written a few at a time (the checks release the GIL),
        # without an fsync each: the start goes on while a thread makes them
        # durable (a pulled copy that a power cut tears fails its checksum on
        # the next read and is pulled again).
        order = sorted(blobs)
        with ThreadPoolExecutor(min(_PULLERS, max(1, len(order)))) as pool:
            stored = pool.map(lambda d: self._store_blob(mc, d, blobs[d]), order)
            for d, handle in zip(order, stored, strict=True):
                if handle is not None:
                    handles[d] = handle
        self._sync_later([mc.layout.artifact_path(d) for d in order if d in handles])
        return handles

    def _sync_later(self, paths: list[Path]) -> None:
        """Make ``paths`` durable in a thread (not a daemon: the interpreter
        waits for it at exit; :meth:`close` too)."""
        if not paths:
            return
        t = threading.Thread(target=_sync, args=(paths,), name="fxpiece-remote-fsync")
        with self._lock:
            self._syncs = [s for s in self._syncs if s.is_alive()]
            self._syncs.append(t)
        t.start()

    def _store_blob(
        self, mc: ModelCache, digest: str, data: bytes | BlobTooLargeError
    ) -> dict[str, Any] | None:
        """Store the blob pulled for ``digest`` here if it decodes as the
        artifact bound to ``digest`` with a trusted signature; its handle,
        else ``None`` (refused: counted, warned once)."""
        if isinstance(data, BlobTooLargeError):
            self._refused(data.strerror or str(data))
            return None
        where = f"{self.store.url} blob {digest[:16]}.."
        try:
            art = decode_artifact(
                data, where, digest, trusted=mc.artifacts.trusted_keys(), unsigned_ok=False
            )
            del data
            if art.digest is None:
                raise CorruptArtifactError(errno.EINVAL, f"{where}: not bound to its digest")
            handle = mc.artifacts.put_decoded(art, durable=False)
        except CorruptArtifactError as e:
            self._refused(e.strerror or str(e))
            return None
        except CacheError as e:
            _log.warning("fxpiece: could not store an artifact pulled from %s: %s", where, e)
            return None
        self._pushed.add(digest)
        self._count("num_remote_hits")
        return handle

    def _pull_result(self, mc: ModelCache, digest: str) -> bool:
        """Whether another host's compile of ``digest`` is here now, pulled
        from the store with its model's entries: its artifact, its index
        entry and its kernel bundle (unpacked: a piece loaded without it
        rebuilds its kernels). The holder pushes the bundle, then the
        artifact, then the entry: until the entry is there, keep waiting."""
        try:
            if not self.store.has_blob(digest):
                return False
        except RemoteUnavailableError as e:
            self.unavailable(e)
            return False
        except ValueError:
            return False
        self._fetch_model(mc)
        if digest not in self._pull_artifacts(mc, [digest]):
            return False
        if self._kernels is not None:
            self._kernels.restore(mc)
        return any(
            isinstance(k, PieceKey) and isinstance(v, Entry) and v.digest == digest
            for k, v in mc.entries.items()
        )

    # -- pushing -----------------------------------------------------------------
    def _push_blob(self, mc: ModelCache, digest: str) -> bool:
        """Put ``digest``'s artifact on the store in its signed file form
        unless it is there; whether the store has it."""
        if digest in self._pushed:
            return True
        art = mc.artifacts.get(digest)
        if art is None:
            return False
        signature = art.signature
        if signature is None:  # pre-v3, from this private root: vouched for by this builder
            message = artifact_message(digest, art.checksum, len(art.payload))
            signature = mc.artifacts.signer().sign_digest(ARTIFACT_KIND, message)
        try:
            if self.store.put_blob(
                digest, encode_artifact(art.payload, digest, signature=signature)
            ):
                self._count("num_remote_pushes")
        except BlobTooLargeError as e:
            _log.warning("fxpiece: not pushed to the remote cache: %s", e.strerror)
            return False
        except RemoteUnavailableError as e:
            self.unavailable(e)
            return False
        self._pushed.add(digest)
        return True

    def close(self) -> None:
        """Wait until the pulled artifacts are durable; drop the store's connections."""
        with self._lock:
            syncs, self._syncs = self._syncs, []
        for t in syncs:
            t.join()
        with contextlib.suppress(RemoteUnavailableError):
            self.store.close()


def _sync(paths: list[Path]) -> None:
    failed = make_durable(paths)
    if failed:
        _log.warning(
            "fxpiece: %d artifact(s) pulled from the remote cache may not survive a power cut "
            "(fsync failed: %s); a torn one is moved aside and pulled again when read",
            len(failed),
            failed[0],
        )


def _lease_name(digest: str) -> str:
    return f"compile:{digest}"


def _artifact_rel(digest: str) -> str:
    return CacheLayout.artifact_rel(digest)


def _has(mc: ModelCache, w: Work) -> bool:
    entry = mc.entries.get(w.key)
    return entry is not None and entry.digest == w.digest
