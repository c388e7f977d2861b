"""The piecewise ``torch.compile`` backend: split -> plan -> build.

>>> import torch, fxpiece
>>> backend = fxpiece.Backend(fxpiece.CompileConfig(compiler="eager", disable_cache=True))
>>> f = torch.compile(lambda x: torch.relu(x) + 1, backend=backend)
>>> f(torch.ones(2)).tolist()
[2.0, 2.0]
>>> backend.stats.counters.num_graphs_seen
1
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.fx

import fxpiece
from fxpiece.cache.keys import (
    KERNELS_KEY,
    IndexKey,
    KeyFactors,
    is_kernels_key,
    kernels_digest,
    piece_kernels_key,
    shared_digest,
)
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.lease import Lease, acquire_or_wait, this_host
from fxpiece.cache.model import ModelCache
from fxpiece.cache.slots import CompileSlots, default_parallel_compiles
from fxpiece.cache.store import checksum
from fxpiece.cache.trust import ensure_private_dir
from fxpiece.config import CompileConfig
from fxpiece.context import current_model_tag
from fxpiece.counters import counters
from fxpiece.errors import (
    CacheError,
    CacheMissError,
    ConfigError,
    CorruptArtifactError,
    UntrustedCacheError,
)
from fxpiece.piecewise import _torch_compat
from fxpiece.piecewise._torch_compat import aot
from fxpiece.piecewise.compilers import make_compiler
from fxpiece.piecewise.dispatch import PieceRunner, token_symbol
from fxpiece.piecewise.factors import make_key_factors, saved_key_factors
from fxpiece.piecewise.interface import CompilerInterface
from fxpiece.piecewise.kernels import HEADERS_SUBDIR, KernelDir
from fxpiece.piecewise.layouts import eager_piece
from fxpiece.piecewise.ops import resolve_splitting_ops
from fxpiece.piecewise.plan import PieceInputs, PiecePlan, Work, fake_inputs, plan_piece
from fxpiece.piecewise.private_dirs import headers_dir, untrusted
from fxpiece.piecewise.split import (
    SplitItem,
    boundary_nodes,
    readable_split,
    split_graph,
    whole_graph,
)
from fxpiece.piecewise.stats import BackendStats, GraphStats, PieceStats, ProgressEvent

__all__ = ["Backend", "OpenedCache", "entry_point"]

_log = logging.getLogger("fxpiece")


@dataclass(frozen=True)
class OpenedCache:
    """A graph's cache: its key factors and model folder."""

    factors: KeyFactors
    model: ModelCache
    miss_explanation: str | None


class Backend:
    """A ``torch.compile`` backend: ``torch.compile(model, backend=Backend(config))``.

    Each Dynamo graph is split at ``config.splitting_ops``; every other piece
    is compiled for every range (symbolic shapes) and exact size (concrete
    shapes) before the first call returns, loaded from the cache when it can
    be, and stitched back so the split ops run eagerly in between.

    Subclasses may override :meth:`before_build` (called with every planned
    :class:`~fxpiece.piecewise.plan.Work` before any is built) and call
    :meth:`compile_work` and :meth:`count`; :mod:`fxpiece.distributed` does.
    """

    aot_unsupported: str | None = None
    """Why this backend cannot serve an ahead-of-time warm start (``None``:
    it can); see :mod:`fxpiece.piecewise.aot_start`."""

    def __init__(
        self,
        config: CompileConfig | None = None,
        progress: Callable[[ProgressEvent], None] | None = None,
    ) -> None:
        self.config = config if config is not None else CompileConfig.from_env()
        self.progress = progress
        """Called after each (piece, entry) is compiled, loaded or reused."""
        self.compiler: CompilerInterface = make_compiler(self.config.compiler)
        if self.compiler.is_inductor:
            # What torch.compile(backend="inductor") imports when it is
            # called, before the model's first call.
            _torch_compat.prepare_inductor()
        self.stats = BackendStats()
        self._splitting = resolve_splitting_ops(self.config.splitting_ops)
        self._inductor_options = dict(self.config.inductor_config)
        self._built: dict[str, Callable[..., Any]] = {}
        """Every digest built by this backend, for reuse across its graphs."""
        self._built_for: dict[str, Path | None] = {}
        """The model folder each digest in :attr:`_built` was first built for."""
        self._kernels: KernelDir | None = None
        self._inductor_dirs: _torch_compat.InductorDirs | None = None
        self._unpacked: set[str] = set()
        """Digests of the kernel bundles unpacked into :attr:`kernel_dir`."""
        self._tags_seen: set[str] = set()
        self._slots: dict[Path, CompileSlots | None] = {}
        """Compile slots by folder (``None``: the folder is unusable)."""
        self._slot_held = False
        """A slot is held for the compile under way (taken before its lease)."""
        if self.config.use_inductor_graph_partition:
            self._inductor_options.update(self._partition_options())
        if not self.config.allow_untrusted_cache:
            self._check_inductor_default()
        if self.config.allow_untrusted_cache and self.cache_enabled():
            _log.warning(
                "fxpiece: allow_untrusted_cache is set: code is loaded from cache folders "
                "and files that other users own or can write"
            )

    def _check_inductor_default(self) -> None:
        """``torch.compile`` reads Inductor's default folder before any backend
        runs (the compiler bisector's status file, whose ``backend=`` line
        replaces the backend given). :func:`fxpiece.compile` calls it with
        :attr:`inductor_dirs` active, so it reads this backend's private
        folder; a plain ``torch.compile(backend=Backend(...))`` reads the
        default one, which fxpiece cannot move: when someone else could write
        it, say so (naming it, and the backend it would swap in)."""
        folder = Path(_torch_compat.inductor_default_dir())
        problem = untrusted(folder)
        if problem is None:
            return
        swap = _torch_compat.bisect_backend_in(str(folder))
        _log.warning(
            "fxpiece: %s.%s fxpiece.compile never reads it; a plain torch.compile(backend=...) "
            "reads its compiler-bisector status before any backend runs: use fxpiece.compile, "
            "or set TORCHINDUCTOR_CACHE_DIR to a folder of yours",
            problem.strerror,
            ""
            if swap is None
            else f" It holds a bisector status that swaps the backend for {swap!r}.",
        )

    def _partition_options(self) -> dict[str, Any]:
        if not _torch_compat.graph_partition_supported():
            raise ConfigError(
                "use_inductor_graph_partition",
                f"torch {torch.__version__} has no Inductor graph partition; "
                "set it to False (FX pre-split)",
            )
        if self._splitting.callables:
            raise ConfigError(
                "use_inductor_graph_partition",
                "Inductor partitions only at operators ('ns::op'); "
                f"{list(self._splitting.labels[len(self._splitting.op_names) :])} are "
                "Python callables: use FX pre-split (False) or name their ops",
            )
        return {
            "graph_partition": True,
            "custom_should_partition_ops": sorted(self._splitting.op_names),
        }

    # -- public hooks --------------------------------------------------------
    def count(self, name: str, n: int = 1) -> None:
        """Add to a counter, process-wide and on this backend's stats."""
        counters.add(name, n)
        self.stats.counters.add(name, n)

    def cache_enabled(self) -> bool:
        return not self.config.disable_cache and not _torch_compat.force_disable_caches()

    @property
    def kernel_dir(self) -> KernelDir:
        """Inductor's cache folder for this backend: private, temporary."""
        if self._kernels is None:
            self._kernels = KernelDir(self.compiler.inductor_cache_subdirs)
        return self._kernels

    @property
    def inductor_dirs(self) -> _torch_compat.InductorDirs:
        """Every folder Inductor uses while this backend compiles or loads:
        :attr:`kernel_dir`, and fxpiece's private folder for the precompiled
        headers Inductor otherwise keeps in a global one
        (:mod:`fxpiece.piecewise.private_dirs`)."""
        if self._inductor_dirs is None:
            kd = self.kernel_dir
            headers, why = headers_dir(fallback=kd.path / HEADERS_SUBDIR)
            if why is not None:
                _log.warning(
                    "fxpiece: %s; precompiled headers are rebuilt in this backend's "
                    "own folder meanwhile",
                    why,
                )
            self._inductor_dirs = _torch_compat.InductorDirs(str(kd.path), str(headers))
        return self._inductor_dirs

    def before_build(self, work: Sequence[Work], model_cache: ModelCache | None) -> None:
        """Hook run after planning, before any entry is loaded or compiled
        (:mod:`fxpiece.distributed` uses it to share artifacts between ranks)."""

    # -- the backend -------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        if not aot.is_capturing():
            return self.build(gm, example_inputs)
        # Ahead-of-time capture (fxpiece.compile with aot): what a warm start
        # needs to rebuild this graph without Dynamo. The pieces are built
        # once the capture says which files were traced (Piecewise.finish).
        marked = _torch_compat.marked_dims(gm)
        fake_mode = _torch_compat.detect_fake_mode(example_inputs)
        fakes = fake_inputs(example_inputs, fake_mode)  # metadata only, never weights
        spec = None if self.config.use_inductor_graph_partition else self._splitting
        state = {**aot.graph_state(gm, fakes, boundary_nodes(gm, spec)), "marked": marked}
        return aot.Piecewise(None, state, pending=(gm, fakes, fake_mode))

    def rebuild(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        state: dict[str, Any],
        full_graph: aot.FullGraph | None = None,
    ) -> Any:
        """Build a graph loaded ahead of time (:mod:`fxpiece.piecewise.aot_start`):
        ``gm`` may be the light graph, ``full_graph`` then loads the whole one."""
        if full_graph is not None and self.compiler.load_uses_inputs:
            gm, full_graph = full_graph(), None  # its loads may read any node's value
        traced = aot.current_files(state["traced_modules"])
        return self.build(
            gm,
            example_inputs,
            traced=traced,
            marked=state["marked"],
            saved=state,
            full_graph=full_graph,
        )

    def build(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        traced: Sequence[str] | None = None,
        marked: Sequence[tuple[int, int]] | None = None,
        saved: dict[str, Any] | None = None,
        full_graph: aot.FullGraph | None = None,
    ) -> Any:
        """Split, plan and build one Dynamo graph. ``traced`` (the source
        files Dynamo traced) and ``marked`` (the token dims the user marked)
        default to what Dynamo's tracing context says. ``saved``: the state
        of an ahead-of-time entry; its key factors are reused when they still
        hold (:func:`~fxpiece.piecewise.factors.saved_key_factors`), and a
        capture records them there. ``full_graph``: ``gm`` is an ahead-of-time
        entry's light graph, and this loads the whole one (for a compile)."""
        t_start = time.perf_counter()
        if traced is None:
            traced = _torch_compat.traced_files()
        if marked is None:
            marked = _torch_compat.marked_dims(gm)
        cfg = self.config
        if _torch_compat.freezing_enabled(self._inductor_options):
            raise ConfigError(
                "inductor_config",
                "Inductor's freezing is not supported by the piecewise backend (it folds "
                "parameters into each piece as constants, which the pieces do not own); "
                "set torch._inductor.config.freezing = False (TORCHINDUCTOR_FREEZING=0)",
            )
        self.count("num_graphs_seen")
        tag = current_model_tag()
        model_tag = tag.tag if tag is not None else cfg.model_tag

        fake_mode = _torch_compat.detect_fake_mode(example_inputs)
        fake_args = fake_inputs(example_inputs, fake_mode)

        t0 = time.perf_counter()
        cache, problem = self._open_or_skip(gm, fake_args, model_tag, traced, saved)
        key_s = time.perf_counter() - t0
        mc = cache.model if cache is not None else None

        t0 = time.perf_counter()
        split_gm, items = self._split(gm)
        split_s = time.perf_counter() - t0
        if mc is not None and not mc.readonly:
            self._best_effort(mc.write_graph, readable_split(split_gm, items))

        self.count("num_piecewise_graphs_seen", len(items))
        compiled_items = [it for it in items if not it.is_splitting_graph]
        self.count("num_piecewise_capturable_graphs_seen", len(compiled_items))

        inputs = PieceInputs(split_gm, fake_args, fake_mode, {it.name for it in compiled_items})
        args_of = inputs.for_planning()
        sym = token_symbol(fake_args, marked)
        factors = cache.factors if cache is not None else None
        gstats = GraphStats(
            cache_key=factors.key if factors else None,
            cache_folder=mc.folder if mc else None,
            pieces=[
                PieceStats(it.index, it.name, it.is_splitting_graph, it.split_op, it.num_nodes)
                for it in items
            ],
            split_s=split_s,
            key_s=key_s,
            started_at=t_start,
            traced_files=len(factors.code["files"]) if factors else 0,
            token_symbol=None if sym is None else str(sym),
            miss_explanation=cache.miss_explanation if cache is not None else None,
            cache_problem=problem,
        )
        self.stats.graphs.append(gstats)

        shared = shared_digest(
            compiler=factors.compiler if factors else self.compiler.compute_hash(),
            inductor=factors.inductor if factors else dict(cfg.inductor_config),
            env=factors.env if factors else {},
            implementations=factors.code.get("implementations") if factors else None,
            partition=cfg.use_inductor_graph_partition,
            version=fxpiece.__version__,
        )
        store = mc.artifacts if mc is not None else None
        whole = None if full_graph is None else self._whole_pieces(items, full_graph)
        plans = [
            plan_piece(
                cfg,
                it,
                args_of[it.name],
                gstats.pieces[it.index],
                store=store,
                shared=shared,
                compiler_name=self.compiler.name,
                inductor_options=self._inductor_options,
                num_pieces=len(items),
                sym=sym,
                exact_args=inputs.exact(it.name),
                full_graph=None if whole is None else functools.partial(whole, it.index),
            )
            for it in compiled_items
        ]
        if mc is not None:
            self._restore_kernels(mc)
        with self.inductor_dirs.active():
            work = [w for p in plans for w in p.work]
            self.before_build(work, mc)
            ready = self._take_free_work(work, mc)
            for plan in plans:
                runner = self._build_piece(plan, mc, ready)
                gstats.runners.append(runner)
                gstats.pieces[plan.item.index].token_arg = (
                    None if plan.token_arg is None else str(plan.token_arg)
                )
                # Not a submodule assignment: what is called is not an nn.Module.
                split_gm.__dict__[plan.item.name] = runner.call
        for it in items:
            if it.is_splitting_graph:
                # The eager piece's own code, without nn.Module's call machinery,
                # its outputs in the layouts the compiled pieces expect.
                split_gm.__dict__[it.name] = eager_piece(it.graph)
        if mc is not None and not mc.readonly:
            self._save_kernels(mc)
        gstats.compile_s = sum(p.compile_s for p in gstats.pieces)
        gstats.load_s = sum(p.load_s for p in gstats.pieces)
        gstats.total_s = time.perf_counter() - t_start
        return split_gm

    def _split(self, gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
        if self.config.use_inductor_graph_partition:
            return whole_graph(gm)
        return split_graph(gm, self._splitting)

    def _whole_pieces(
        self, items: Sequence[SplitItem], full_graph: aot.FullGraph
    ) -> Callable[[int], torch.fx.GraphModule]:
        """Piece ``i`` split from the whole graph (loaded and split once, on
        the first call), for compiling a piece planned from the light graph."""
        whole_items = functools.cache(lambda: self._split(full_graph())[1])

        def piece(index: int) -> torch.fx.GraphModule:
            graph = whole_items()[index].graph
            if graph.code != items[index].graph.code:
                raise RuntimeError(
                    f"fxpiece: piece {index} of an ahead-of-time entry's whole graph differs "
                    "from its light copy; clear the entry (fxpiece cache prune) and report it"
                )
            return graph

        return piece

    # -- the cache -----------------------------------------------------------
    def _open_or_skip(
        self,
        gm: torch.fx.GraphModule,
        fake_args: Sequence[Any],
        model_tag: str,
        traced: Sequence[str],
        saved: dict[str, Any] | None = None,
    ) -> tuple[OpenedCache | None, str | None]:
        """The graph's cache, or ``(None, why)`` when it cannot be used: the
        graph then compiles in memory. Only the trust boundary, a required
        hit and config errors raise."""
        if not self.cache_enabled():
            return None, None
        try:
            return self.open_cache(gm, fake_args, model_tag, traced, saved), None
        except (UntrustedCacheError, CacheMissError, ConfigError):
            raise
        except OSError as e:  # CacheError included: folder is a file, EACCES, EROFS, ENOSPC
            why = f"{type(e).__name__}: {e}"
            _log.warning("fxpiece: cache unusable, compiling in memory: %s", why)
            return None, why

    def open_cache(
        self,
        gm: torch.fx.GraphModule,
        fake_args: Sequence[Any],
        model_tag: str,
        traced: Sequence[str],
        saved: dict[str, Any] | None = None,
    ) -> OpenedCache:
        """Compute the key (or reuse ``saved["factors"]``, see :meth:`build`)
        and open the model's cache folder."""
        cfg = self.config
        readonly = cfg.cache_readonly
        root = cfg.resolved_cache_dir()
        layout = CacheLayout(root if readonly else ensure_private_dir(root))
        # The key's ISA probe compiles test programs in Inductor's folder.
        prior = saved.get("factors") if saved is not None else None
        factors = saved_key_factors(prior, cfg) if isinstance(prior, dict) else None
        if factors is None:
            with self.inductor_dirs.active():
                factors = make_key_factors(cfg, self.compiler.compute_hash(), gm, fake_args, traced)
        if saved is not None:
            saved["factors"] = factors.as_dict()
        miss_explanation = None
        if not layout.model_dir(factors.key, model_tag).is_dir():
            miss_explanation = self._explain_new_key(layout.root, model_tag, factors)
            if cfg.require_cache_hit:
                raise CacheMissError(
                    errno.ENOENT,
                    f"require_cache_hit: no cache for model tag {model_tag!r} under "
                    f"key {factors.key[:16]}; {miss_explanation}",
                    str(layout.root),
                )
        model = ModelCache(
            layout, factors.key, model_tag, trust=cfg.allow_untrusted_cache, readonly=readonly
        )
        if not readonly:
            self._best_effort(model.write_factors, factors.as_dict())
        return OpenedCache(factors, model, miss_explanation)

    def _explain_new_key(self, root: Path, model_tag: str, factors: KeyFactors) -> str:
        """Why this key is new: the factors that differ from the nearest
        cached key of the same model tag (logged once per graph)."""
        from fxpiece.cache.explain import nearest_sibling

        first = model_tag not in self._tags_seen
        self._tags_seen.add(model_tag)
        found = nearest_sibling(root, model_tag, factors.as_dict(), exclude_key=factors.key)
        if found is None:
            return f"no other key is cached for model tag {model_tag!r}"
        folder, diff = found
        text = f"nearest cached key {folder.parent.name[:16]} differs: {diff.summary()}"
        # A model's 2nd, 3rd... Dynamo graph is new to the cache by nature:
        # say so only when a cached key of this very graph differs.
        if first or diff.graph is None:
            _log.warning("fxpiece: cache miss for model tag %r: %s", model_tag, text)
        return text

    @staticmethod
    def _best_effort(write: Callable[[Any], None], value: Any) -> None:
        """A write that helps people (readable graph, factors) but that the
        cache does not need: a failure is logged, not raised."""
        try:
            write(value)
        except OSError as e:
            _log.warning("fxpiece: could not write to the cache: %s", e)

    # -- kernels ---------------------------------------------------------------
    def _restore_kernels(self, mc: ModelCache) -> None:
        """Unpack the model's verified kernel bundles (the model's and those
        of the pieces in its index) not unpacked yet into Inductor's private
        folder, so loads rebuild no C++ kernel. The bundle of a piece whose
        entry is gone (pruned) is left alone: nothing touches it, so it ages
        out."""
        entries = mc.index.entries()
        pieces = {k[:3] for k, _ in entries if not is_kernels_key(k)}
        for key, value in entries:
            if not is_kernels_key(key) or not isinstance(value, dict):
                continue
            if key != KERNELS_KEY and key[:3] not in pieces:
                continue
            digest = value.get("digest")
            if not isinstance(digest, str) or digest in self._unpacked:
                continue
            self._unpacked.add(digest)  # a bad bundle is reported once
            # A corrupt bundle is moved aside with the index entries that
            # point at it (ModelCache.quarantine): reported by one start only.
            payload = mc.artifacts.load_buffer(value.get("handle"))
            if payload is None:
                self.count("num_corrupt_artifacts")
                mc.forget(value.get("handle"))  # warned once: the entry goes with it
                _log.warning(
                    "fxpiece: a kernel bundle is missing or corrupt; its kernels are rebuilt"
                )
                continue
            try:
                self.kernel_dir.unpack(payload, delta=key != KERNELS_KEY)
            except CorruptArtifactError as e:  # verified, but no bundle inside
                self.count("num_corrupt_artifacts")
                mc.quarantine(value.get("handle"))
                _log.warning("fxpiece: %s; moved aside, kernels are rebuilt", e)
            except CacheError as e:
                self.count("num_corrupt_artifacts")
                _log.warning("fxpiece: %s; kernels are rebuilt", e)

    def _kernels_pending(self, w: Work, mc: ModelCache) -> bool:
        """Whether the piece's own kernel bundle is stored but not unpacked."""
        value = mc.index.get(piece_kernels_key(w.key))
        return isinstance(value, dict) and value.get("digest") not in self._unpacked

    def _save_kernels(self, mc: ModelCache) -> None:
        """Store what Inductor built or rebuilt for this graph outside the
        pieces' own bundles, if anything."""
        self._store_kernels(mc, KERNELS_KEY, self.kernel_dir.bundle)

    def _store_kernels(
        self, mc: ModelCache, key: IndexKey, pack: Callable[[], bytes | None]
    ) -> None:
        """Pack (``pack``: the kernel folder's bundle or delta) and store a
        kernel bundle; a failure to pack or store it is a warning, never a
        failed compile (the kernels are rebuilt by a later load)."""
        if mc.readonly:
            return
        try:
            payload = pack()
            if payload is None:
                return
            digest = kernels_digest(checksum(payload))
            handle = mc.artifacts.put(digest, payload)
            mc.index.insert(key, {"digest": digest, "handle": handle})
            self._unpacked.add(digest)
        except CacheError as e:
            _log.warning("fxpiece: could not store a kernel bundle: %s", e)

    # -- building ------------------------------------------------------------
    def _take_free_work(
        self, work: Sequence[Work], mc: ModelCache | None
    ) -> dict[int, tuple[Callable[..., Any], str, float]]:
        """First pass (work stealing across processes): load what is cached
        and compile what nobody else is compiling, without waiting for
        another process; the rest is left to :meth:`_obtain`, which waits
        for its holder. ``{id(work): (fn, action, seconds)}``."""
        ready: dict[int, tuple[Callable[..., Any], str, float]] = {}
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
                ready[id(w)] = (fn, action, time.perf_counter() - t0)
        return ready

    def _compile_if_free(self, w: Work, mc: ModelCache) -> Callable[..., Any] | None:
        """Compile ``w`` now if a compile slot of this host is free and its
        lease is free (or stale); ``None`` otherwise (the second pass waits
        for the holder, or for a slot). Taking a piece only with a free slot
        keeps a rank from queueing for a slot behind another rank's compile
        with a lease others could have waited on: with one slot per host,
        one rank compiles while the others load what it stores."""
        slot = self._try_slot(mc)
        if slot is None:
            return None
        try:
            path = str(mc.layout.lease_path(w.digest))
            ttl = self.config.lease_ttl
            try:
                mc.ensure_locks_dir()
                lease = Lease.try_take(path, ttl=ttl)
            except OSError:
                return None  # the second pass compiles it without a lease
            if lease is None:
                return None
            try:
                fn = self._poll(w, mc)  # finished between our miss and our lease
                if fn is not None:
                    return fn
                self.count("num_cache_misses")
                self._slot_held = True
                try:
                    return self.compile_work(w, mc)
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
        slots = self._slots_for(self.slot_folder(mc))
        if slots is None:
            return True
        try:
            slot, _ = slots.acquire(0.0)
        except OSError:
            return True
        return slot

    def _build_piece(
        self,
        plan: PiecePlan,
        mc: ModelCache | None,
        ready: dict[int, tuple[Callable[..., Any], str, float]] | None = None,
    ) -> PieceRunner:
        cfg = self.config
        it = plan.item
        built: list[tuple[Any, Callable[..., Any]]] = []
        for w in plan.work:
            self.count("num_backend_compilations")
            w.stats.entries.append(str(w.entry))
            t0 = time.perf_counter()
            fn = self._built.get(w.digest)
            first = ready.get(id(w)) if ready else None
            if first is not None:
                fn, action, seconds = first
                t0 -= seconds
                self._remember(w, fn, mc)
            elif fn is not None:
                # An identical piece (another layer, another graph) was built here.
                w.stats.reused += 1
                self.count("num_cache_hits")
                action = "reused"
                self._index_shared(w, mc)
            else:
                compiled_before = w.stats.compiled
                fn = self._obtain(w, mc)
                action = "compiled" if w.stats.compiled > compiled_before else "loaded"
                self._remember(w, fn, mc)
            if self.progress is not None:
                self.progress(
                    ProgressEvent(
                        it.index, plan.num_pieces, w.entry, action, time.perf_counter() - t0
                    )
                )
            if cfg.static_graph_wrapper is not None and w.entry.is_single_size:
                fn = cfg.static_graph_wrapper(fn, it.index, w.entry)
            built.append((w.entry, fn))
        return PieceRunner(
            index=it.index,
            graph=it.graph,
            entries=built,
            token_arg=plan.token_arg,
            strict=cfg.strict,
            counters=(counters, self.stats.counters),
        )

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
        try:
            mc.ensure_locks_dir()
            outcome = acquire_or_wait(
                str(mc.layout.lease_path(w.digest)),
                ttl=self.config.lease_ttl,
                timeout=self.config.lock_timeout,
                poll=lambda: self._poll(w, mc),
            )
        except UntrustedCacheError:
            raise  # locks/ is a symlink or another user's: refused, never followed
        except OSError as e:  # locks/ is a file, not writable, ...
            _log.warning("fxpiece: no compile lease (%s); compiling without one", e)
            self.count("num_cache_misses")
            return self.compile_work(w, mc)
        if outcome.waited_s:
            self.count("num_cache_waits")
            w.stats.wait_s += outcome.waited_s
        if outcome.result is not None:
            return outcome.result
        if outcome.lease is None:
            _log.warning(
                "fxpiece: waited %.0f s for another process compiling piece %d %s; "
                "compiling it here too",
                self.config.lock_timeout,
                w.item.index,
                w.entry,
            )
        try:
            if outcome.lease is not None:
                # It may have been finished between our miss and our lease.
                fn = self._poll(w, mc)
                if fn is not None:
                    return fn
            self._require_hit(
                w,
                mc,
                "is not in the cache; the model's key matched, so its artifact was "
                "removed or failed verification: rebuild the cache",
            )
            self.count("num_cache_misses")
            return self.compile_work(w, mc)
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

    def _poll(self, w: Work, mc: ModelCache) -> Callable[..., Any] | None:
        try:
            mc.index.refresh()
        except CacheError as e:
            _log.warning("fxpiece: cannot re-read the index: %s", e)
        return self._load(w, mc)

    def _load(self, w: Work, mc: ModelCache) -> Callable[..., Any] | None:
        value = mc.index.get(w.key)
        if self._kernels_pending(w, mc):
            # Stored by another process after this build started.
            self._restore_kernels(mc)
        shared = None
        if not isinstance(value, dict) or value.get("digest") != w.digest:
            # Another graph or model may have stored this very digest (an
            # artifact is bound to the digest it is stored under: a file
            # moved there from another digest's path is corrupt).
            shared, corrupt = mc.artifacts.lookup(w.digest)
            if shared is None:
                if corrupt:
                    self.count("num_corrupt_artifacts")
                    _log.warning(
                        "fxpiece: the stored artifact for piece %d %s is corrupt or not "
                        "the one stored under its digest; moved aside, recompiling",
                        w.item.index,
                        w.entry,
                    )
                return None
            value = {"digest": w.digest, "handle": shared}
        t0 = time.perf_counter()
        try:
            args = w.example_inputs() if self.compiler.load_uses_inputs else w.args
            fn = self.compiler.load(value.get("handle"), w.item.graph, args, w.entry, w.ctx)
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
            mc.quarantine(value.get("handle"))
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
        if shared is not None:
            self._record(w, mc, value)
        return fn

    def _remember(self, w: Work, fn: Callable[..., Any], mc: ModelCache | None) -> None:
        """Keep what was built for ``w``'s digest, and for which model folder."""
        self._built[w.digest] = fn
        self._built_for[w.digest] = None if mc is None else mc.folder

    def _index_shared(self, w: Work, mc: ModelCache | None) -> None:
        """Point this graph's index entry at the stored artifact of a piece
        built earlier in this process (another graph's identical piece), so
        a warm start finds it through the index."""
        if mc is None or mc.readonly or self._built_for.get(w.digest) == mc.folder:
            return  # another layer of the same graph: it loads from the first
        value = mc.index.get(w.key)
        if isinstance(value, dict) and value.get("digest") == w.digest:
            return
        handle = mc.artifacts.existing(w.digest)
        if handle is not None:  # None: it could not be stored (compiled in memory)
            self._record(w, mc, {"digest": w.digest, "handle": handle})

    def _record(self, w: Work, mc: ModelCache, value: dict[str, Any]) -> None:
        if mc.readonly:
            return
        try:
            mc.index.insert(w.key, value)
            self.count("num_cache_entries_updated")
        except CacheError as e:
            _log.warning("fxpiece: could not record piece %d in the index: %s", w.item.index, e)

    def compile_work(self, w: Work, mc: ModelCache | None) -> Callable[..., Any]:
        """Compile one planned entry and record it in ``mc``'s index (if any)."""
        return self._compile(w, mc)

    def slot_folder(self, mc: ModelCache | None) -> tuple[Path, Path] | None:
        """Where this host's compile slots are, as ``(base, folder)``: under
        the cache root (``locks/slots/<host>``, every level below the root
        checked before anything is created in it) when the cache is written;
        ``None`` (no bound) when this process shares no cache with others
        (disabled or read-only: it compiles in memory, alone)."""
        if mc is not None and not mc.readonly:
            return mc.layout.root, mc.layout.locks_dir / "slots" / this_host()
        return None

    def parallel_compiles(self) -> int:
        """Compile slots per host: ``config.max_parallel_compiles``, else
        the cores divided by Inductor's compile threads."""
        n = self.config.max_parallel_compiles
        if n is None:
            n = default_parallel_compiles()
        self.stats.max_parallel_compiles = n
        return n

    def _slots_for(self, place: tuple[Path, Path] | None) -> CompileSlots | None:
        """The slots in ``place`` (:meth:`slot_folder`; ``None``: no folder,
        or it is unusable)."""
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
    def compile_slot(self, w: Work, mc: ModelCache | None) -> Iterator[None]:
        """Hold one of this host's compile slots (waiting for one, up to
        ``lock_timeout``) for the block."""
        slots_or_none = None if self._slot_held else self._slots_for(self.slot_folder(mc))
        if slots_or_none is None:
            yield
            return
        try:
            slot, waited = slots_or_none.acquire(self.config.lock_timeout)
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

    def _compile(self, w: Work, mc: ModelCache | None) -> Callable[..., Any]:
        with self.compile_slot(w, mc):
            t0 = time.perf_counter()
            wall0 = time.time()
            result = self.compiler.compile(w.graph(), w.example_inputs(), w.entry, w.ctx)
            w.stats.compile_intervals.append((wall0, time.time()))
        w.stats.compile_s += time.perf_counter() - t0
        w.stats.compiled += 1
        self.count("num_inductor_compiles" if self.compiler.is_inductor else "num_eager_compiles")
        if mc is not None and result.handle is not None:
            # The kernels first: whoever sees the piece's entry finds them.
            self._store_kernels(mc, piece_kernels_key(w.key), self.kernel_dir.delta)
            if isinstance(result.handle, dict) and "artifact" in result.handle:
                self.count("num_compiled_artifacts_saved")
            try:
                mc.index.insert(w.key, {"digest": w.digest, "handle": result.handle})
                self.count("num_cache_entries_updated")
            except CacheError as e:
                _log.warning("fxpiece: could not record piece %d in the index: %s", w.item.index, e)
        return result.fn


def entry_point(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """``torch.compile(model, backend="fxpiece")``: a backend configured by
    :meth:`CompileConfig.from_env`."""
    return Backend(CompileConfig.from_env())(gm, example_inputs)
