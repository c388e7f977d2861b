"""The piecewise ``torch.compile`` backend.

>>> import torch, fxpiece
>>> backend = fxpiece.Backend(fxpiece.CompileConfig(compiler="eager", disable_cache=True))
>>> f = torch.compile(lambda x: torch.relu(x) + 1, backend=backend)
>>> f(torch.ones(2)).tolist()
[2.0, 2.0]
>>> backend.stats.counters.num_graphs_seen
1
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.fx

from fxpiece import _torch_compat
from fxpiece.cache_key import (
    KeyFactors,
    input_meta,
    make_key_factors,
    piece_signature,
)
from fxpiece.compiler_interface import CompileContext, CompilerInterface
from fxpiece.compilers import make_compiler
from fxpiece.config import CompileConfig
from fxpiece.context import current_model_tag
from fxpiece.counters import Counters, counters
from fxpiece.errors import CacheMissError, ConfigError
from fxpiece.hashing import hash_factors
from fxpiece.lease import Lease, read_lease
from fxpiece.ops import resolve_splitting_ops
from fxpiece.passes import PassManager
from fxpiece.piecewise import PieceRunner, concrete_inputs, token_symbol_index
from fxpiece.ranges import Range
from fxpiece.split import SplitItem, split_graph
from fxpiece.store import ModelCache, ensure_private_dir

__all__ = [
    "Backend",
    "BackendStats",
    "GraphStats",
    "PiecePlan",
    "PieceStats",
    "ProgressEvent",
    "Work",
    "entry_point",
]

_log = logging.getLogger("fxpiece")


@dataclass
class PieceStats:
    """What happened to one piece of one graph."""

    index: int
    name: str
    is_splitting_graph: bool
    split_op: str | None
    num_nodes: int
    entries: list[str] = field(default_factory=list)
    compiled: int = 0
    """Entries compiled by the compiler (Inductor or eager)."""
    loaded: int = 0
    """Entries loaded from the cache."""
    reused: int = 0
    """Entries served by an identical piece compiled in this graph."""
    compile_s: float = 0.0
    load_s: float = 0.0
    wait_s: float = 0.0
    """Time spent waiting for another process compiling this piece."""


@dataclass
class GraphStats:
    """One Dynamo graph handed to the backend."""

    cache_key: str | None
    cache_folder: Path | None
    pieces: list[PieceStats]
    split_s: float = 0.0
    key_s: float = 0.0
    compile_s: float = 0.0
    load_s: float = 0.0
    total_s: float = 0.0
    traced_files: int = 0
    miss_explanation: str | None = None
    """Why the cache missed, when another key of the same model tag exists."""
    runners: list[PieceRunner] = field(default_factory=list, repr=False)

    @property
    def num_pieces(self) -> int:
        return len(self.pieces)

    @property
    def num_compiled_pieces(self) -> int:
        return sum(1 for p in self.pieces if not p.is_splitting_graph)


@dataclass(frozen=True)
class Work:
    """One (piece, entry) to load or compile."""

    item: SplitItem
    entry: Range
    args: Sequence[Any]
    ctx: CompileContext
    stats: PieceStats


@dataclass(frozen=True)
class PiecePlan:
    item: SplitItem
    sym_index: int | None
    work: tuple[Work, ...]
    num_pieces: int


@dataclass(frozen=True)
class ProgressEvent:
    """One (piece, entry) done: ``action`` is compiled, loaded or reused."""

    piece: int
    num_pieces: int
    entry: Range
    action: str
    seconds: float


@dataclass
class BackendStats:
    """Counters, timings and split results of one :class:`Backend`."""

    counters: Counters = field(default_factory=Counters)
    graphs: list[GraphStats] = field(default_factory=list)

    @property
    def compile_s(self) -> float:
        return sum(g.compile_s for g in self.graphs)

    @property
    def load_s(self) -> float:
        return sum(g.load_s for g in self.graphs)

    @property
    def total_s(self) -> float:
        return sum(g.total_s for g in self.graphs)


class Backend:
    """A ``torch.compile`` backend: ``torch.compile(model, backend=Backend(config))``.

    Each Dynamo graph is split at ``config.splitting_ops``; every other piece
    is compiled for every range (symbolic shapes) and exact size (concrete
    shapes) before the first call returns, loaded from the cache when it can
    be, and stitched back so the split ops run eagerly in between.
    """

    def __init__(
        self,
        config: CompileConfig | None = None,
        progress: Callable[[ProgressEvent], None] | None = None,
    ) -> None:
        self.config = config if config is not None else CompileConfig.from_env()
        self.progress = progress
        """Called after each (piece, entry) is compiled, loaded or reused."""
        self.compiler: CompilerInterface = make_compiler(self.config.compiler)
        self.stats = BackendStats()
        self._splitting = resolve_splitting_ops(self.config.splitting_ops)
        self._inductor_options = dict(self.config.inductor_config)
        if self.config.use_inductor_graph_partition:
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
            self._inductor_options.update(
                graph_partition=True,
                custom_should_partition_ops=sorted(self._splitting.op_names),
            )

    # -- helpers -----------------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        counters.add(name, n)
        self.stats.counters.add(name, n)

    def _cache_enabled(self) -> bool:
        return not self.config.disable_cache and not _torch_compat.force_disable_caches()

    # -- the backend -------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        t_start = time.perf_counter()
        cfg = self.config
        self._count("num_graphs_seen")
        tag = current_model_tag()
        model_tag = tag.tag if tag is not None else cfg.model_tag
        cache_on = self._cache_enabled()

        fake_mode = _torch_compat.detect_fake_mode(example_inputs)
        fake_args = _fake_inputs(example_inputs, fake_mode)

        t0 = time.perf_counter()
        factors, model_cache, inductor_dir, miss_explanation = (
            self._open_cache(gm, fake_args, model_tag) if cache_on else (None, None, None, None)
        )
        readonly = cfg.cache_readonly
        key_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        if cfg.use_inductor_graph_partition:
            split_gm, items = _whole_graph(gm)
        else:
            split_gm, items = split_graph(gm, self._splitting)
        split_s = time.perf_counter() - t0
        if model_cache is not None and not readonly:
            model_cache.write_text("computation_graph.py", _readable(split_gm, items))

        self._count("num_piecewise_graphs_seen", len(items))
        compiled_items = [it for it in items if not it.is_splitting_graph]
        self._count("num_piecewise_capturable_graphs_seen", len(compiled_items))

        piece_args = _piece_inputs(
            split_gm, fake_args, fake_mode, {it.name for it in compiled_items}
        )
        gstats = GraphStats(
            cache_key=factors.key if factors else None,
            cache_folder=model_cache.folder if model_cache else None,
            pieces=[
                PieceStats(it.index, it.name, it.is_splitting_graph, it.split_op, it.num_nodes)
                for it in items
            ],
            split_s=split_s,
            key_s=key_s,
            traced_files=len(factors.code["files"]) if factors else 0,
            miss_explanation=miss_explanation,
        )
        self.stats.graphs.append(gstats)

        shared = hash_factors(
            {
                "compiler": factors.compiler if factors else self.compiler.compute_hash(),
                "inductor": factors.inductor if factors else dict(cfg.inductor_config),
                "env": factors.env if factors else {},
                "partition": cfg.use_inductor_graph_partition,
            }
        )
        plans = [
            self._plan_piece(
                it, piece_args[it.name], gstats.pieces[it.index], model_cache, shared, len(items)
            )
            for it in compiled_items
        ]
        done: dict[str, Callable[..., Any]] = {}
        with _torch_compat.inductor_cache_dir(inductor_dir):
            self.before_build([w for p in plans for w in p.work], model_cache)
            for plan in plans:
                runner = self._build_piece(plan, model_cache, done)
                gstats.runners.append(runner)
                # Not a submodule assignment: the runner is not an nn.Module.
                split_gm.__dict__[plan.item.name] = runner
        gstats.compile_s = sum(p.compile_s for p in gstats.pieces)
        gstats.load_s = sum(p.load_s for p in gstats.pieces)
        gstats.total_s = time.perf_counter() - t_start
        return split_gm

    def _open_cache(
        self, gm: torch.fx.GraphModule, fake_args: Sequence[Any], model_tag: str
    ) -> tuple[KeyFactors, ModelCache, str, str | None]:
        """Compute the key and open the model's cache folder: ``(factors,
        model cache, Inductor's cache dir, why the key is new or None)``."""
        cfg = self.config
        readonly = cfg.cache_readonly
        if readonly:
            root = cfg.resolved_cache_dir()
            inductor_dir = _readonly_inductor_dir(root)
        else:
            root = ensure_private_dir(cfg.resolved_cache_dir())
            inductor_dir = str(ensure_private_dir(root / "inductor"))
        # Inside the cache: the key's ISA probe compiles test programs.
        with _torch_compat.inductor_cache_dir(inductor_dir):
            factors = make_key_factors(
                cfg, self.compiler.compute_hash(), gm, fake_args, _torch_compat.traced_files()
            )
        miss_explanation = None
        if not (root / "models" / factors.key[:32] / model_tag).is_dir():
            miss_explanation = self._explain_new_key(root, model_tag, factors)
            if cfg.require_cache_hit:
                raise CacheMissError(
                    errno.ENOENT,
                    f"require_cache_hit: no cache for model tag {model_tag!r} under "
                    f"key {factors.key[:16]}; {miss_explanation}",
                    str(root),
                )
        model_cache = ModelCache(
            root, factors.key, model_tag, trust=cfg.allow_untrusted_cache, readonly=readonly
        )
        if not readonly:
            model_cache.write_factors(factors.as_dict())
        return factors, model_cache, inductor_dir, miss_explanation

    def _explain_new_key(self, root: Path, model_tag: str, factors: KeyFactors) -> str:
        """Why this key is new: the factors that differ from the nearest
        cached key of the same model tag (logged once per graph)."""
        from fxpiece.explain import nearest_sibling

        found = nearest_sibling(root, model_tag, factors.as_dict(), exclude_key=factors.key)
        if found is None:
            return f"no other key is cached for model tag {model_tag!r}"
        folder, diff = found
        text = f"nearest cached key {folder.parent.name[:16]} differs: {diff.summary()}"
        _log.warning("fxpiece: cache miss for model tag %r: %s", model_tag, text)
        return text

    def _entries_for(self, args: Sequence[Any]) -> tuple[int | None, tuple[Range, ...]]:
        sym_index = token_symbol_index(args)
        if sym_index is None:
            # Static shapes: one compile serves every call.
            return None, (Range(1, self.config.max_num_tokens),)
        return sym_index, self.config.compile_entries

    def _plan_piece(
        self,
        it: SplitItem,
        args: Sequence[Any],
        ps: PieceStats,
        model_cache: ModelCache | None,
        shared: str,
        num_pieces: int,
    ) -> PiecePlan:
        """Every entry of one piece with its example inputs and digest."""
        cfg = self.config
        sym_index, entries = self._entries_for(args)
        signature = piece_signature(it.graph)
        meta = [input_meta(a) for a in args]
        work: list[Work] = []
        for entry in entries:
            concrete = entry.is_single_size and sym_index is not None
            ex_args: Sequence[Any] = args
            if concrete:
                assert sym_index is not None
                conc = concrete_inputs(args, sym_index, entry.start)
                if conc is None:
                    concrete = False
                else:
                    ex_args = conc
            pm = PassManager(cfg.post_grad_passes, entry) if cfg.post_grad_passes else None
            digest = hash_factors(
                {
                    "piece": signature,
                    "inputs": meta,
                    "entry": [entry.start, entry.end, concrete],
                    "shared": shared,
                    "passes": pm.uuid() if pm else None,
                    "compiler": self.compiler.name,
                }
            )
            ctx = CompileContext(
                store=model_cache.artifacts if model_cache else None,
                digest=digest,
                inductor_config=self._inductor_options,
                post_grad_pass=pm,
            )
            work.append(Work(it, entry, ex_args, ctx, ps))
        return PiecePlan(it, sym_index, tuple(work), num_pieces)

    def before_build(self, work: Sequence[Work], model_cache: ModelCache | None) -> None:
        """Hook run after planning, before any entry is loaded or compiled
        (:mod:`fxpiece.distributed` uses it to share artifacts between ranks)."""

    def _build_piece(
        self,
        plan: PiecePlan,
        model_cache: ModelCache | None,
        done: dict[str, Callable[..., Any]],
    ) -> PieceRunner:
        cfg = self.config
        it = plan.item
        built: list[tuple[Range, Callable[..., Any]]] = []
        for w in plan.work:
            self._count("num_backend_compilations")
            w.stats.entries.append(str(w.entry))
            t0 = time.perf_counter()
            before = (w.stats.compiled, w.stats.loaded)
            fn = done.get(w.ctx.digest)
            if fn is not None:
                # An identical piece (another layer) was just compiled or loaded.
                w.stats.reused += 1
                self._count("num_cache_hits")
                action = "reused"
            else:
                fn = self._obtain(it, w.entry, w.args, w.ctx, model_cache, w.stats)
                action = "compiled" if w.stats.compiled > before[0] else "loaded"
            if self.progress is not None:
                self.progress(
                    ProgressEvent(
                        it.index, plan.num_pieces, w.entry, action, time.perf_counter() - t0
                    )
                )
            done[w.ctx.digest] = fn
            if cfg.static_graph_wrapper is not None and w.entry.is_single_size:
                fn = cfg.static_graph_wrapper(fn, it.index, w.entry)
            built.append((w.entry, fn))
        return PieceRunner(
            index=it.index,
            graph=it.graph,
            entries=built,
            sym_index=plan.sym_index,
            strict=cfg.strict,
            counters=(counters, self.stats.counters),
        )

    def _index_key(self, it: SplitItem, entry: Range) -> tuple[int, int, int, str]:
        return (entry.start, entry.end, it.index, self.compiler.name)

    def _obtain(
        self,
        it: SplitItem,
        entry: Range,
        args: Sequence[Any],
        ctx: CompileContext,
        model_cache: ModelCache | None,
        ps: PieceStats,
    ) -> Callable[..., Any]:
        """Load the entry, or compile it under a single-flight lease: if
        another process is compiling the same digest, wait for its result."""
        if model_cache is None:
            self._count("num_cache_misses")
            return self._compile(it, entry, args, ctx, None, ps)
        fn = self._load(it, entry, args, ctx, model_cache, ps)
        if fn is not None:
            return fn
        if model_cache.readonly:
            # Read-only cache: compile the miss in memory, write nothing.
            self._count("num_cache_misses")
            if self.config.require_cache_hit:
                raise CacheMissError(
                    errno.ENOENT,
                    f"require_cache_hit: piece {it.index} entry {entry} is not in the "
                    f"read-only cache (digest {ctx.digest[:16]})",
                    str(model_cache.folder),
                )
            return self._compile(it, entry, args, replace(ctx, store=None), None, ps)
        lease_dir = ensure_private_dir(model_cache.root / "locks")
        path = str(lease_dir / f"{ctx.digest}.lease")
        lease = Lease.try_acquire(path, ttl=self.config.lease_ttl)
        if lease is None:
            self._count("num_cache_waits")
            t0 = time.perf_counter()
            lease, fn = self._wait(path, it, entry, args, ctx, model_cache, ps)
            ps.wait_s += time.perf_counter() - t0
            if fn is not None:
                return fn
        try:
            if lease is not None:
                # It may have been finished between our miss and our lease.
                model_cache.index.refresh()
                fn = self._load(it, entry, args, ctx, model_cache, ps)
                if fn is not None:
                    return fn
            self._count("num_cache_misses")
            if self.config.require_cache_hit:
                raise CacheMissError(
                    errno.ENOENT,
                    f"require_cache_hit: piece {it.index} entry {entry} is not in the cache "
                    f"(digest {ctx.digest[:16]}); the model's key matched, so its artifact "
                    "was removed or failed verification: rebuild the cache",
                    str(model_cache.folder),
                )
            return self._compile(it, entry, args, ctx, model_cache, ps)
        finally:
            if lease is not None:
                lease.release()

    def _wait(
        self,
        path: str,
        it: SplitItem,
        entry: Range,
        args: Sequence[Any],
        ctx: CompileContext,
        model_cache: ModelCache,
        ps: PieceStats,
    ) -> tuple[Lease | None, Callable[..., Any] | None]:
        """Wait for the lease holder's result; take the lease over if its
        holder died (dead pid here, or lease not renewed in its ttl)."""
        ttl = self.config.lease_ttl
        deadline = time.monotonic() + self.config.lock_timeout
        delay = 0.05
        while True:
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)
            model_cache.index.refresh()
            fn = self._load(it, entry, args, ctx, model_cache, ps)
            if fn is not None:
                return None, fn
            info = read_lease(path)
            if info is None:
                lease = Lease.try_acquire(path, ttl=ttl)
            elif Lease.is_stale(info):
                lease = Lease.take_over(path, info, ttl=ttl)
            else:
                lease = None
            if lease is not None:
                return lease, None
            if time.monotonic() > deadline:
                _log.warning(
                    "fxpiece: waited %.0f s for another process compiling piece %d %s; "
                    "compiling it here too",
                    self.config.lock_timeout,
                    it.index,
                    entry,
                )
                return None, None

    def _load(
        self,
        it: SplitItem,
        entry: Range,
        args: Sequence[Any],
        ctx: CompileContext,
        model_cache: ModelCache,
        ps: PieceStats,
    ) -> Callable[..., Any] | None:
        value = model_cache.index.get(self._index_key(it, entry))
        if not isinstance(value, dict) or value.get("digest") != ctx.digest:
            return None
        t0 = time.perf_counter()
        try:
            fn = self.compiler.load(
                value.get("handle"), it.graph, args, entry, ctx, model_cache.root
            )
        except Exception as e:  # pruned meanwhile, or unloadable: recompile, never crash
            _log.warning(
                "fxpiece: loading piece %d %s failed (%s: %s)", it.index, entry, type(e).__name__, e
            )
            fn = None
        if fn is None:
            self._count("num_corrupt_artifacts")
            _log.warning(
                "fxpiece: cached artifact for piece %d %s is missing or corrupt; recompiling",
                it.index,
                entry,
            )
            return None
        ps.load_s += time.perf_counter() - t0
        ps.loaded += 1
        self._count("num_cache_hits")
        return fn

    def _compile(
        self,
        it: SplitItem,
        entry: Range,
        args: Sequence[Any],
        ctx: CompileContext,
        model_cache: ModelCache | None,
        ps: PieceStats,
    ) -> Callable[..., Any]:
        t0 = time.perf_counter()
        result = self.compiler.compile(it.graph, args, entry, ctx)
        ps.compile_s += time.perf_counter() - t0
        ps.compiled += 1
        self._count("num_inductor_compiles" if self.compiler.is_inductor else "num_eager_compiles")
        if model_cache is not None and result.handle is not None:
            if isinstance(result.handle, dict) and "artifact" in result.handle:
                self._count("num_compiled_artifacts_saved")
            model_cache.index.insert(
                self._index_key(it, entry), {"digest": ctx.digest, "handle": result.handle}
            )
            self._count("num_cache_entries_updated")
        return result.fn


def _readonly_inductor_dir(root: Path) -> str:
    """Inductor writes into its cache dir even to load (kernels, locks): use
    the cache's own when writable, else a private temporary one."""
    own = root / "inductor"
    if own.is_dir() and os.access(own, os.W_OK):
        return str(own)
    return tempfile.mkdtemp(prefix="fxpiece-inductor-")


def _fake_inputs(example_inputs: Sequence[Any], fake_mode: Any) -> list[Any]:
    """The graph inputs as fake tensors of the tracing fake mode (symbolic
    shapes; the mode memoises the fakes Dynamo made)."""
    if fake_mode is None:
        return list(example_inputs)
    return [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in example_inputs]


def _piece_inputs(
    split_gm: torch.fx.GraphModule,
    fake_args: Sequence[Any],
    fake_mode: Any,
    names: set[str],
) -> dict[str, tuple[Any, ...]]:
    """Run the split module on fake inputs and record each piece's arguments
    (their order is the piece's, not Dynamo's)."""
    captured: dict[str, tuple[Any, ...]] = {}

    class Recorder(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            if target in names:
                captured[str(target)] = tuple(args)
            return super().call_module(target, args, kwargs)

    import contextlib

    ctx = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with ctx, torch.no_grad():
        Recorder(split_gm).run(*fake_args)
    return captured


def _whole_graph(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Graph-partition mode: one piece, the whole graph (Inductor partitions)."""
    from torch.fx.passes.split_module import split_module

    split_gm = split_module(gm, gm, lambda n: 0, keep_original_order=True)
    sub = split_gm.submod_0
    assert isinstance(sub, torch.fx.GraphModule)
    return split_gm, [SplitItem("submod_0", 0, 0, False, sub, None)]


def _readable(split_gm: torch.fx.GraphModule, items: Sequence[SplitItem]) -> str:
    lines = ["# fxpiece: the split graph; pieces marked SPLIT run eagerly.", ""]
    for it in items:
        kind = f"SPLIT at {it.split_op}" if it.is_splitting_graph else "compiled"
        lines.append(f"# piece {it.index} ({it.name}): {kind}, {it.num_nodes} nodes")
    lines.append("")
    lines.append(split_gm.print_readable(print_output=False))
    return "\n".join(lines)


def entry_point(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """``torch.compile(model, backend="fxpiece")``: a backend configured by
    :meth:`CompileConfig.from_env`."""
    return Backend(CompileConfig.from_env())(gm, example_inputs)
