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

import functools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx

import fxpiece
from fxpiece.cache.entries import MODEL_KERNELS
from fxpiece.cache.keys import shared_digest
from fxpiece.cache.model import ModelCache
from fxpiece.config import CompileConfig
from fxpiece.counters import counters
from fxpiece.errors import ConfigError
from fxpiece.piecewise import _torch_compat
from fxpiece.piecewise._torch_compat import aot
from fxpiece.piecewise.cache_open import (
    GraphCacheOpener,
    OpenedCache,
    best_effort,
    model_tag_for,
)
from fxpiece.piecewise.compilers import make_compiler
from fxpiece.piecewise.coordination import Coordination, SharedFolder
from fxpiece.piecewise.dispatch import PieceRunner, token_symbol
from fxpiece.piecewise.interface import CompilerInterface
from fxpiece.piecewise.job import FullGraph, GraphJob
from fxpiece.piecewise.kernel_cache import KernelCache
from fxpiece.piecewise.kernels import HEADERS_SUBDIR, KernelDir
from fxpiece.piecewise.layouts import eager_piece
from fxpiece.piecewise.ops import resolve_splitting_ops
from fxpiece.piecewise.plan import PieceInputs, PiecePlan, Work, fake_inputs, plan_piece
from fxpiece.piecewise.private_dirs import headers_dir, untrusted
from fxpiece.piecewise.resolver import Resolved, Resolver
from fxpiece.piecewise.split import (
    SplitItem,
    boundary_nodes,
    readable_split,
    split_graph,
    whole_graph,
)
from fxpiece.piecewise.stats import BackendStats, GraphStats, PieceStats, ProgressEvent

__all__ = ["Backend", "entry_point"]

_log = logging.getLogger("fxpiece")


class Backend:
    """A ``torch.compile`` backend: ``torch.compile(model, backend=Backend(config))``.

    Each Dynamo graph is split at ``config.splitting_ops``; every other piece
    is compiled for every range (symbolic shapes) and exact size (concrete
    shapes) before the first call returns, loaded from the cache when it can
    be, and stitched back so the split ops run eagerly in between.

    What it does with a graph: receive, split, plan, hand the planned work
    to its :class:`~fxpiece.piecewise.resolver.Resolver` (the cache
    protocol: load, or lease, compile and record), stitch. How processes
    sharing the cache coordinate is ``coordination`` (default
    :class:`~fxpiece.piecewise.coordination.SharedFolder`: leases and slots
    in the cache root; :class:`~fxpiece.distributed.DistributedBackend`
    passes collectives); with ``config.remote_cache`` it is wrapped in a
    :class:`~fxpiece.piecewise.remote_tier.RemoteTier`.
    """

    def __init__(
        self,
        config: CompileConfig | None = None,
        progress: Callable[[ProgressEvent], None] | None = None,
        coordination: Coordination | None = None,
    ) -> None:
        self.config = config if config is not None else CompileConfig.from_env()
        self.progress = progress
        """Called after each (piece, entry) is compiled, loaded or reused."""
        self.compiler: CompilerInterface = make_compiler(self.config.compiler)
        self.stats = BackendStats()
        self._splitting = resolve_splitting_ops(self.config.splitting_ops)
        self._inductor_options = dict(self.config.inductor_config)
        self._kernels: KernelDir | None = None
        self._inductor_dirs: _torch_compat.InductorDirs | None = None
        self._kernel_cache: KernelCache | None = None
        self.coordination: Coordination = (
            coordination if coordination is not None else SharedFolder()
        )
        if self.config.remote_cache is not None and self.cache_enabled():
            # The fleet's second tier (pull on a miss, push once built, one
            # compile per fleet), around how this host's processes coordinate.
            # Imported here: a start without one keeps its modules (and the
            # cache admin code its sync format shares) out, about 40 ms.
            from fxpiece.piecewise.remote_tier import RemoteTier
            from fxpiece.remote import open_remote

            self.coordination = RemoteTier(
                self.coordination, open_remote(self.config.remote_cache), count=self.count
            )
        self._resolver: Resolver | None = None
        self._opener = GraphCacheOpener(
            self.config, self.compiler.compute_hash, lambda: self.inductor_dirs
        )
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

    @property
    def aot_unsupported(self) -> str | None:
        """Why this backend cannot serve an ahead-of-time warm start (``None``:
        it can); see :mod:`fxpiece.piecewise.aot_start`."""
        return self.coordination.aot_unsupported

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

    @property
    def kernel_cache(self) -> KernelCache:
        """The kernel bundles restored into and stored from :attr:`kernel_dir`."""
        if self._kernel_cache is None:
            self._kernel_cache = KernelCache(self.kernel_dir, self.count)
        return self._kernel_cache

    @property
    def resolver(self) -> Resolver:
        """This backend's cache protocol (:mod:`fxpiece.piecewise.resolver`)."""
        if self._resolver is None:
            self._resolver = Resolver(
                self.config,
                self.compiler,
                self.kernel_cache,
                self.coordination,
                self.stats,
                self.count,
            )
        return self._resolver

    # -- the backend -------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        return self.build(GraphJob.from_dynamo(gm, example_inputs))

    def capture(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> aot.Piecewise:
        """The backend Dynamo calls while :mod:`fxpiece.piecewise.aot_start`
        captures ahead of time: records what a warm start needs to build
        this graph without Dynamo, and builds nothing yet (the pieces are
        built once the capture says which files were traced:
        :meth:`Piecewise.build <fxpiece.piecewise._torch_compat.aot.Piecewise.build>`)."""
        fake_mode = _torch_compat.detect_fake_mode(example_inputs)
        fakes = fake_inputs(example_inputs, fake_mode)  # metadata only, never weights
        spec = None if self.config.use_inductor_graph_partition else self._splitting
        state = {
            **aot.graph_state(gm, fakes, boundary_nodes(gm, spec)),
            "marked": _torch_compat.marked_dims(gm),
        }
        return aot.Piecewise(state, captured=(gm, fakes, fake_mode))

    def build(self, job: GraphJob) -> Any:
        """Split, plan and build one graph (:class:`~fxpiece.piecewise.job.GraphJob`):
        Dynamo's now, or one an ahead-of-time entry saved. The pieces are
        loaded or compiled by the resolver, then stitched; returns the
        stitched graph's callable."""
        if job.full_graph is not None and self.compiler.load_uses_inputs:
            job = job.whole()  # its loads may read any node's value
        t_start = time.perf_counter()
        self._refuse_freezing()
        self.count("num_graphs_seen")
        fake_mode = _torch_compat.detect_fake_mode(job.example_inputs)
        fake_args = fake_inputs(job.example_inputs, fake_mode)

        t0 = time.perf_counter()
        cache, problem = (
            self._opener.open_or_skip(
                job.gm, fake_args, model_tag_for(self.config), job.traced, job.saved
            )
            if self.cache_enabled()
            else (None, None)
        )
        key_s = time.perf_counter() - t0
        mc = cache.model if cache is not None else None

        t0 = time.perf_counter()
        split_gm, items = self._split(job.gm)
        split_s = time.perf_counter() - t0
        if mc is not None and not mc.readonly:
            best_effort(mc.write_graph, lambda: readable_split(split_gm, items))
        compiled_items = [it for it in items if not it.is_splitting_graph]
        self.count("num_piecewise_graphs_seen", len(items))
        self.count("num_piecewise_capturable_graphs_seen", len(compiled_items))

        inputs = PieceInputs(split_gm, fake_args, fake_mode, {it.name for it in compiled_items})
        sym = token_symbol(fake_args, job.marked)
        gstats = _graph_stats(items, cache, problem, sym, split_s, key_s, t_start)
        self.stats.graphs.append(gstats)
        plans = self._plans(job, items, inputs, gstats, cache, sym)
        if mc is not None:
            self.kernel_cache.restore(mc)
        with self.inductor_dirs.active():
            resolved = self.resolver.resolve(plans, mc, self._report)
        self._stitch(split_gm, items, plans, resolved, gstats)
        if mc is not None and not mc.readonly:
            self._store_model_kernels(mc)
        gstats.compile_s = sum(p.compile_s for p in gstats.pieces)
        gstats.load_s = sum(p.load_s for p in gstats.pieces)
        gstats.total_s = time.perf_counter() - t_start
        return split_gm

    def _refuse_freezing(self) -> None:
        if _torch_compat.freezing_enabled(self._inductor_options):
            raise ConfigError(
                "inductor_config",
                "Inductor's freezing is not supported by the piecewise backend (it folds "
                "parameters into each piece as constants, which the pieces do not own); "
                "set torch._inductor.config.freezing = False (TORCHINDUCTOR_FREEZING=0)",
            )

    def _plans(
        self,
        job: GraphJob,
        items: Sequence[SplitItem],
        inputs: PieceInputs,
        gstats: GraphStats,
        cache: OpenedCache | None,
        sym: Any,
    ) -> list[PiecePlan]:
        """The planned work of every compiled piece: its entries (ranges and
        exact sizes), each with its key and what is stored for it."""
        cfg = self.config
        factors = cache.factors if cache is not None else None
        shared = shared_digest(
            compiler=factors.compiler if factors else self.compiler.compute_hash(),
            inductor=factors.inductor if factors else dict(cfg.inductor_config),
            env=factors.env if factors else {},
            implementations=factors.code.get("implementations") if factors else None,
            partition=cfg.use_inductor_graph_partition,
            version=fxpiece.__version__,
        )
        store = cache.model.artifacts if cache is not None else None
        whole = None if job.full_graph is None else self._whole_pieces(items, job.full_graph)
        args_of = inputs.for_planning()
        return [
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
                inductor=self.inductor_dirs,
            )
            for it in items
            if not it.is_splitting_graph
        ]

    def _stitch(
        self,
        split_gm: torch.fx.GraphModule,
        items: Sequence[SplitItem],
        plans: Sequence[PiecePlan],
        resolved: Sequence[Sequence[Resolved]],
        gstats: GraphStats,
    ) -> None:
        """Put each compiled piece's runner and each eager piece's code in
        the split graph."""
        for plan, got in zip(plans, resolved, strict=True):
            runner = self._runner(plan, got)
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

    def _store_model_kernels(self, mc: ModelCache) -> None:
        """The model's kernel bundle (what Inductor built for this graph),
        published when it changed."""
        bundle = mc.entries.get(MODEL_KERNELS)
        self.kernel_cache.save_model(mc)
        if mc.entries.get(MODEL_KERNELS) != bundle:
            self.coordination.publish(mc, [MODEL_KERNELS])

    def _report(self, plan: PiecePlan, w: Work, r: Resolved) -> None:
        """Progress: one (piece, entry) is ready."""
        if self.progress is not None:
            self.progress(
                ProgressEvent(plan.item.index, plan.num_pieces, w.entry, r.action, r.seconds)
            )

    def _runner(self, plan: PiecePlan, got: Sequence[Resolved]) -> PieceRunner:
        """The piece's entries stitched into one callable (each single-size
        entry through ``static_graph_wrapper``, when set)."""
        cfg = self.config
        built: list[tuple[Any, Callable[..., Any]]] = []
        for w, r in zip(plan.work, got, strict=True):
            fn = r.fn
            if cfg.static_graph_wrapper is not None and w.entry.is_single_size:
                fn = cfg.static_graph_wrapper(fn, plan.item.index, w.entry)
            built.append((w.entry, fn))
        return PieceRunner(
            index=plan.item.index,
            graph=plan.item.graph,
            entries=built,
            token_arg=plan.token_arg,
            strict=cfg.strict,
            counters=(counters, self.stats.counters),
        )

    def _split(self, gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
        if self.config.use_inductor_graph_partition:
            return whole_graph(gm)
        return split_graph(gm, self._splitting)

    def _whole_pieces(
        self, items: Sequence[SplitItem], full_graph: FullGraph
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


def _graph_stats(
    items: Sequence[SplitItem],
    cache: OpenedCache | None,
    problem: str | None,
    sym: Any,
    split_s: float,
    key_s: float,
    started_at: float,
) -> GraphStats:
    """A graph's result record, before its pieces are built."""
    factors = cache.factors if cache is not None else None
    return GraphStats(
        cache_key=factors.key if factors else None,
        cache_folder=cache.model.folder if cache is not None else None,
        pieces=[
            PieceStats(it.index, it.name, it.is_splitting_graph, it.split_op, it.num_nodes)
            for it in items
        ],
        split_s=split_s,
        key_s=key_s,
        started_at=started_at,
        traced_files=len(factors.code["files"]) if factors else 0,
        token_symbol=None if sym is None else str(sym),
        miss_explanation=cache.miss_explanation if cache is not None else None,
        cache_problem=problem,
    )


def entry_point(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """``torch.compile(model, backend="fxpiece")``: a backend configured by
    :meth:`CompileConfig.from_env`."""
    return Backend(CompileConfig.from_env())(gm, example_inputs)
