"""The cache protocol: for each planned (piece, entry), load it, or take a
lease and a compile slot and compile it, then record it in the index.

:class:`Resolver` is given how processes coordinate
(:class:`~fxpiece.piecewise.coordination.Coordination`: leases and slots in
a shared folder by default; collectives for a ``torch.distributed`` job)
and works in two passes over a graph's work:

1. without waiting for anyone: load what is cached, compile what nobody else
   is compiling when a slot of this host is free (work stealing);
2. for the rest, in order: load, or wait for the process holding the lease
   (its result is loaded), or take the lease and compile.

An identical piece (another layer, another graph of this backend) is built
once and reused. The backend only plans before and stitches after.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fxpiece.cache.entries import Entry
from fxpiece.cache.lease import Lease
from fxpiece.cache.model import ModelCache
from fxpiece.cache.slots import CompileSlots, default_parallel_compiles
from fxpiece.config import CompileConfig
from fxpiece.errors import CacheError, CacheMissError, UntrustedCacheError
from fxpiece.piecewise.coordination import Coordination
from fxpiece.piecewise.interface import CompilerInterface
from fxpiece.piecewise.kernel_cache import KernelCache
from fxpiece.piecewise.plan import PiecePlan, Work
from fxpiece.piecewise.stats import BackendStats

__all__ = ["Resolved", "Resolver"]

_log = logging.getLogger("fxpiece")


@dataclass(frozen=True, slots=True)
class Resolved:
    """One entry's callable and how it was obtained."""

    fn: Callable[..., Any]
    action: str
    """``"compiled"``, ``"loaded"`` or ``"reused"``."""
    seconds: float


OnEntry = Callable[[PiecePlan, Work, Resolved], None]


class Resolver:
    """One backend's cache protocol (see the module docstring)."""

    def __init__(
        self,
        config: CompileConfig,
        compiler: CompilerInterface,
        kernels: KernelCache,
        coordination: Coordination,
        stats: BackendStats,
        count: Callable[[str], None],
    ) -> None:
        self.config = config
        self.compiler = compiler
        self.kernels = kernels
        self.coordination = coordination
        self.stats = stats
        self.count = count
        """Adds to a counter, process-wide and on the backend's stats."""
        self._built: dict[str, Callable[..., Any]] = {}
        """Every digest built here, for reuse across graphs."""
        self._built_for: dict[str, Path | None] = {}
        """The model folder each digest was first built for."""
        self._slots: dict[Path, CompileSlots | None] = {}
        """Compile slots by folder (``None``: the folder is unusable)."""
        self._slot_held = False
        """A slot is held for the compile under way (taken before its lease)."""

    # -- the two passes ---------------------------------------------------------
    def resolve(
        self, plans: Sequence[PiecePlan], mc: ModelCache | None, on_entry: OnEntry
    ) -> list[list[Resolved]]:
        """Every plan's entries, in order; ``on_entry`` is called as each is
        ready (progress)."""
        work = [w for p in plans for w in p.work]
        self.coordination.before(self, work, mc)
        ready = self._take_free_work(work, mc)
        out = []
        for plan in plans:
            got = []
            for w in plan.work:
                r = self._resolve_one(w, mc, ready.get(id(w)))
                on_entry(plan, w, r)
                got.append(r)
            out.append(got)
        return out

    def _take_free_work(self, work: Sequence[Work], mc: ModelCache | None) -> dict[int, Resolved]:
        """First pass: load what is cached and compile what nobody else is
        compiling, without waiting for another process."""
        ready: dict[int, Resolved] = {}
        if mc is None or mc.readonly or self.config.require_cache_hit:
            return ready
        seen: set[str] = set()
        for w in work:
            if w.digest in self._built or w.digest in seen:
                continue
            t0 = time.perf_counter()
            compiled_before = w.stats.compiled
            fn = self._load(w, mc)
            if fn is None:
                fn = self._compile_if_free(w, mc)
            if fn is not None:
                seen.add(w.digest)
                action = "compiled" if w.stats.compiled > compiled_before else "loaded"
                ready[id(w)] = Resolved(fn, action, time.perf_counter() - t0)
        return ready

    def _resolve_one(self, w: Work, mc: ModelCache | None, first: Resolved | None) -> Resolved:
        self.count("num_backend_compilations")
        w.stats.entries.append(str(w.entry))
        if first is not None:
            self._remember(w, first.fn, mc)
            return first
        t0 = time.perf_counter()
        fn = self._built.get(w.digest)
        if fn is not None:
            # An identical piece (another layer, another graph) was built here.
            w.stats.reused += 1
            self.count("num_cache_hits")
            self._index_shared(w, mc)
            return Resolved(fn, "reused", time.perf_counter() - t0)
        compiled_before = w.stats.compiled
        fn = self._obtain(w, mc)
        self._remember(w, fn, mc)
        action = "compiled" if w.stats.compiled > compiled_before else "loaded"
        return Resolved(fn, action, time.perf_counter() - t0)

    def _compile_if_free(self, w: Work, mc: ModelCache) -> Callable[..., Any] | None:
        """Compile ``w`` now if a compile slot of this host and its lease are
        free (or stale); ``None`` otherwise (the second pass waits for the
        holder, or for a slot). Taking a piece only with a free slot keeps a
        process from queueing for a slot behind another's compile with a
        lease others could have waited on."""
        slot = self._try_slot(mc)
        if slot is None:
            return None
        try:
            try:
                lease = self.coordination.try_lease(mc, w.digest, self.config.lease_ttl)
            except OSError:
                return None  # the second pass compiles it without a lease
            if lease is None:
                return None
            try:
                fn = self._poll(w, mc, leased=True)  # finished between our miss and our lease
                if fn is not None:
                    return fn
                self.count("num_cache_misses")
                self._slot_held = True
                try:
                    return self.compile(w, mc)
                finally:
                    self._slot_held = False
            finally:
                lease.release()
        finally:
            if isinstance(slot, Lease):
                slot.release()

    def _try_slot(self, mc: ModelCache) -> Lease | bool | None:
        """A free compile slot without waiting: the slot, ``True`` when
        compiles are not bounded here, ``None`` when every slot is taken."""
        slots = self._slots_for(self.coordination.slot_folder(mc))
        if slots is None:
            return True
        try:
            slot, _ = slots.acquire(0.0)
        except OSError:
            return True
        return slot

    def _obtain(self, w: Work, mc: ModelCache | None) -> Callable[..., Any]:
        """Load the entry, or compile it under a single-flight lease: if
        another process is compiling the same digest, wait for its result."""
        if mc is None:
            self.count("num_cache_misses")
            return self._compile(w, None)
        fn = self._load(w, mc)
        if fn is not None:
            return fn
        if mc.readonly:
            # Read-only cache: compile the miss in memory, write nothing.
            self._require_hit(w, mc, "is not in the read-only cache")
            self.count("num_cache_misses")
            return self._compile(replace(w, ctx=replace(w.ctx, store=None)), None)
        cfg = self.config
        try:
            outcome = self.coordination.lease_or_wait(
                mc,
                w.digest,
                ttl=cfg.lease_ttl,
                timeout=cfg.lock_timeout,
                poll=lambda: self._poll(w, mc),
            )
        except UntrustedCacheError:
            raise  # locks/ is a symlink or another user's: refused, never followed
        except OSError as e:  # locks/ is a file, not writable, ...
            _log.warning("fxpiece: no compile lease (%s); compiling without one", e)
            self.count("num_cache_misses")
            return self.compile(w, mc)
        if outcome.waited_s:
            self.count("num_cache_waits")
            w.stats.wait_s += outcome.waited_s
        if outcome.result is not None:
            return outcome.result
        if outcome.lease is None:
            _log.warning(
                "fxpiece: waited %.0f s for another process compiling piece %d %s; "
                "compiling it here too",
                cfg.lock_timeout,
                w.item.index,
                w.entry,
            )
        try:
            if outcome.lease is not None:
                fn = self._poll(w, mc, leased=True)  # finished between our miss and our lease
                if fn is not None:
                    return fn
            self._require_hit(
                w,
                mc,
                "is not in the cache; the model's key matched, so its artifact was "
                "removed or failed verification: rebuild the cache",
            )
            self.count("num_cache_misses")
            return self.compile(w, mc)
        finally:
            if outcome.lease is not None:
                outcome.lease.release()

    def _require_hit(self, w: Work, mc: ModelCache, what: str) -> None:
        if self.config.require_cache_hit:
            raise CacheMissError(
                errno.ENOENT,
                f"require_cache_hit: piece {w.item.index} entry {w.entry} {what} "
                f"(digest {w.digest[:16]})",
                str(mc.folder),
            )

    # -- loading -----------------------------------------------------------------
    def _poll(self, w: Work, mc: ModelCache, *, leased: bool = False) -> Callable[..., Any] | None:
        try:
            mc.index.refresh()
        except CacheError as e:
            _log.warning("fxpiece: cannot re-read the index: %s", e)
        return self._load(w, mc, leased=leased)

    def _entry_value(self, w: Work, mc: ModelCache) -> tuple[Entry | None, bool]:
        """``(entry, shared)``: the index entry for ``w``, or one made from an
        artifact another graph or model stored under the same digest
        (``shared``: it is recorded once it loads)."""
        entry = mc.entries.get(w.key)
        if entry is not None and entry.digest == w.digest:
            return entry, False
        # An artifact is bound to the digest it is stored under: a file moved
        # there from another digest's path is corrupt (moved aside).
        handle, corrupt = mc.artifacts.lookup(w.digest)
        if handle is None:
            if corrupt:
                self.count("num_corrupt_artifacts")
                _log.warning(
                    "fxpiece: the stored artifact for piece %d %s is corrupt or not "
                    "the one stored under its digest; moved aside, recompiling",
                    w.item.index,
                    w.entry,
                )
            return None, False
        return Entry(w.digest, handle), True

    def _load(self, w: Work, mc: ModelCache, *, leased: bool = False) -> Callable[..., Any] | None:
        """The piece's cached entry loaded, or ``None``. ``leased``: this
        process holds the piece's compile lease."""
        if self.kernels.pending(w.key, mc):
            self.kernels.restore(mc)  # stored by another process after this build began
        entry, shared = self._entry_value(w, mc)
        if entry is None:
            return None
        if shared and not leased and self._being_compiled(w, mc):
            # Its compiler stored the artifact and has yet to store the
            # piece's kernels and index entry: loaded now, it would rebuild
            # those kernels (seconds of C++ on cores the compile needs).
            return None
        t0 = time.perf_counter()
        try:
            args = w.example_inputs() if self.compiler.load_uses_inputs else w.args
            if w.ctx.inductor is not None and not self.compiler.load_prepares_inductor:
                w.ctx.inductor.prepare()
            fn = self.compiler.load(entry.handle, w.item.graph, args, w.entry, w.ctx)
        except UntrustedCacheError:
            raise
        except Exception as e:  # pruned meanwhile, or unloadable: recompile, never crash
            _log.warning(
                "fxpiece: loading piece %d %s failed (%s: %s)",
                w.item.index,
                w.entry,
                type(e).__name__,
                e,
            )
            # It verified but does not load: moved aside with the entries
            # that point at it, so the recompile stores its own.
            mc.quarantine(entry.handle)
            fn = None
        if fn is None:
            self.count("num_corrupt_artifacts")
            _log.warning(
                "fxpiece: cached artifact for piece %d %s is missing or corrupt; recompiling",
                w.item.index,
                w.entry,
            )
            return None
        w.stats.load_s += time.perf_counter() - t0
        w.stats.loaded += 1
        self.count("num_cache_hits")
        if shared:
            self.record(w, mc, entry)
        return fn

    def _being_compiled(self, w: Work, mc: ModelCache) -> bool:
        """Whether another process holds the piece's compile lease (never
        asked of a read-only cache: taking a lease writes under its root)."""
        if mc.readonly:
            return False
        try:
            lease = self.coordination.try_lease(mc, w.digest, self.config.lease_ttl)
        except OSError:
            return False
        if lease is None:
            return True
        lease.release()
        return False

    # -- recording -----------------------------------------------------------------
    def _remember(self, w: Work, fn: Callable[..., Any], mc: ModelCache | None) -> None:
        self._built[w.digest] = fn
        self._built_for[w.digest] = None if mc is None else mc.folder

    def _index_shared(self, w: Work, mc: ModelCache | None) -> None:
        """Point this graph's index entry at the stored artifact of a piece
        built earlier in this process (another graph's identical piece), so
        a warm start finds it through the index."""
        if mc is None or mc.readonly or self._built_for.get(w.digest) == mc.folder:
            return  # another layer of the same graph: it loads from the first
        entry = mc.entries.get(w.key)
        if entry is not None and entry.digest == w.digest:
            return
        handle = mc.artifacts.existing(w.digest)
        if handle is not None:  # None: it could not be stored (compiled in memory)
            self.record(w, mc, Entry(w.digest, handle))

    def record(self, w: Work, mc: ModelCache, entry: Entry) -> None:
        """Insert ``w``'s index entry (a failure is a warning: the piece
        still runs, a later start compiles it again)."""
        if mc.readonly:
            return
        try:
            mc.entries.put(w.key, entry)
            self.count("num_cache_entries_updated")
        except CacheError as e:
            _log.warning("fxpiece: could not record piece %d in the index: %s", w.item.index, e)

    # -- compiling -------------------------------------------------------------------
    def compile(self, w: Work, mc: ModelCache | None) -> Callable[..., Any]:
        """Compile one planned entry (holding a compile slot) and store it:
        its kernels first (whoever sees the piece's entry finds them), then
        its index entry."""
        return self._compile(w, mc)

    def _compile(self, w: Work, mc: ModelCache | None) -> Callable[..., Any]:
        with self._compile_slot(w, mc):
            t0 = time.perf_counter()
            wall0 = time.time()
            if w.ctx.inductor is not None:
                w.ctx.inductor.prepare()  # Inductor's compiler: imported once something compiles
            result = self.compiler.compile(w.graph(), w.example_inputs(), w.entry, w.ctx)
            w.stats.compile_intervals.append((wall0, time.time()))
        w.stats.compile_s += time.perf_counter() - t0
        w.stats.compiled += 1
        self.count("num_inductor_compiles" if self.compiler.is_inductor else "num_eager_compiles")
        if mc is not None and result.handle is not None:
            self.kernels.save_piece(mc, w.key)
            entry = Entry(w.digest, result.handle)
            if entry.names_artifact:
                self.count("num_compiled_artifacts_saved")
            self.record(w, mc, entry)
            self.coordination.publish(mc, [w.key.kernels(), w.key])  # before the lease goes
        return result.fn

    def parallel_compiles(self) -> int:
        """Compile slots per host: ``config.max_parallel_compiles``, else
        the cores divided by Inductor's compile threads."""
        n = self.config.max_parallel_compiles
        if n is None:
            n = default_parallel_compiles()
        self.stats.max_parallel_compiles = n
        return n

    def _slots_for(self, place: tuple[Path, Path] | None) -> CompileSlots | None:
        """The slots in ``place`` (``None``: no folder, or it is unusable)."""
        if place is None:
            return None
        base, folder = place
        if folder not in self._slots:
            slots = CompileSlots(
                folder, self.parallel_compiles(), ttl=self.config.lease_ttl, base=base
            )
            why = slots.prepare()
            if why is not None:
                _log.warning("fxpiece: compile slots unusable (%s); compiles are not bounded", why)
            self._slots[folder] = None if why is not None else slots
        return self._slots[folder]

    @contextlib.contextmanager
    def _compile_slot(self, w: Work, mc: ModelCache | None) -> Iterator[None]:
        """Hold one of this host's compile slots (waiting for one, up to
        ``lock_timeout``) for the block."""
        slots = None if self._slot_held else self._slots_for(self.coordination.slot_folder(mc))
        if slots is None:
            yield
            return
        try:
            slot, waited = slots.acquire(self.config.lock_timeout)
        except OSError as e:
            _log.warning("fxpiece: no compile slot (%s); compiling without one", e)
            slot, waited = None, 0.0
        w.stats.slot_wait_s += waited
        if slot is None and waited:
            _log.warning("fxpiece: no compile slot freed up in %.0f s; compiling anyway", waited)
        try:
            yield
        finally:
            if slot is not None:
                slot.release()
