"""Kernel bundles in a model's cache: unpacked into Inductor's private folder
before pieces load (so no C++ kernel is rebuilt), stored after they compile.

A bundle is an ordinary artifact (see :mod:`fxpiece.piecewise.kernels` for
its format) referenced from the model's index: the model's own
(:data:`~fxpiece.cache.entries.MODEL_KERNELS`, what loads rebuilt outside
any piece) and one per compiled piece (:meth:`~fxpiece.cache.entries.PieceKey.kernels`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fxpiece.cache.entries import MODEL_KERNELS, Entry, KernelsKey, PieceKey
from fxpiece.cache.keys import kernels_digest
from fxpiece.cache.model import ModelCache
from fxpiece.cache.store import checksum
from fxpiece.errors import CacheError, CorruptArtifactError
from fxpiece.piecewise.kernels import KernelDir

__all__ = ["KernelCache"]

_log = logging.getLogger("fxpiece")


class KernelCache:
    """The kernel bundles one backend has unpacked into ``kernel_dir`` and
    stored from it; ``count`` adds to the backend's counters."""

    def __init__(self, kernel_dir: KernelDir, count: Callable[[str], None]) -> None:
        self.kernel_dir = kernel_dir
        self._count = count
        self._unpacked: set[str] = set()
        """Digests of the bundles unpacked (or stored) here."""

    def restore(self, mc: ModelCache) -> None:
        """Unpack the model's verified bundles (the model's and those of the
        pieces in its index) not unpacked yet. The bundle of a piece whose
        entry is gone (pruned) is left alone: nothing touches it, so it ages
        out. A bad bundle is reported once: moved aside (or, when gone, its
        entry dropped) in the same step."""
        items = mc.entries.items()
        pieces = {k.kernels() for k, _ in items if isinstance(k, PieceKey)}
        for key, entry in items:
            if not isinstance(key, KernelsKey) or not isinstance(entry, Entry):
                continue
            if not key.model_wide and key not in pieces:
                continue
            if entry.digest in self._unpacked:
                continue
            self._unpacked.add(entry.digest)
            self._unpack(mc, entry, delta=not key.model_wide)

    def _unpack(self, mc: ModelCache, entry: Entry, *, delta: bool) -> None:
        payload = mc.artifacts.load_buffer(entry.handle)
        if payload is None:
            self._count("num_corrupt_artifacts")
            mc.forget(entry.handle)  # warned once: the entry goes with it
            _log.warning("fxpiece: a kernel bundle is missing or corrupt; its kernels are rebuilt")
            return
        try:
            self.kernel_dir.unpack(payload, delta=delta)
        except CorruptArtifactError as e:  # verified, but no bundle inside
            self._count("num_corrupt_artifacts")
            mc.quarantine(entry.handle)
            _log.warning("fxpiece: %s; moved aside, kernels are rebuilt", e)
        except CacheError as e:
            self._count("num_corrupt_artifacts")
            _log.warning("fxpiece: %s; kernels are rebuilt", e)

    def pending(self, key: PieceKey, mc: ModelCache) -> bool:
        """Whether the bundle of the piece at index ``key`` is stored but not
        unpacked here (stored by another process after this build began)."""
        entry = mc.entries.get(key.kernels())
        return entry is not None and entry.digest not in self._unpacked

    def save_model(self, mc: ModelCache) -> None:
        """Store what Inductor built or rebuilt outside the pieces' own
        bundles, if anything."""
        self.store(mc, MODEL_KERNELS, self.kernel_dir.bundle)

    def save_piece(self, mc: ModelCache, key: PieceKey) -> None:
        """Store what the compile of the piece at ``key`` just built."""
        self.store(mc, key.kernels(), self.kernel_dir.delta)

    def store(self, mc: ModelCache, key: KernelsKey, pack: Callable[[], bytes | None]) -> None:
        """Pack (``pack``: the kernel folder's bundle or delta) and store a
        bundle under ``key``; a failure to pack or store it is a warning,
        never a failed compile (the kernels are rebuilt by a later load)."""
        if mc.readonly:
            return
        try:
            payload = pack()
            if payload is None:
                return
            digest = kernels_digest(checksum(payload))
            handle = mc.artifacts.put(digest, payload)
            mc.entries.put(key, Entry(digest, handle))
            self._unpacked.add(digest)
        except CacheError as e:
            _log.warning("fxpiece: could not store a kernel bundle: %s", e)
