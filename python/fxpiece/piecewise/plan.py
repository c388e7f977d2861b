"""Planning: every (piece, entry) to build, with its example inputs, its
artifact digest and its index key, before anything is loaded or compiled."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from fxpiece.cache.entries import PieceKey
from fxpiece.cache.keys import artifact_digest
from fxpiece.cache.store import ArtifactStore
from fxpiece.config import CompileConfig
from fxpiece.piecewise.dispatch import TokenArg, concrete_inputs, find_token_arg
from fxpiece.piecewise.factors import input_meta, piece_signature
from fxpiece.piecewise.interface import CompileContext, InductorFolder
from fxpiece.piecewise.layouts import conform_fakes
from fxpiece.piecewise.passes import PassManager
from fxpiece.piecewise.split import SplitItem
from fxpiece.piecewise.stats import PieceStats
from fxpiece.ranges import Range

__all__ = [
    "PieceInputs",
    "PiecePlan",
    "Work",
    "fake_inputs",
    "plan_piece",
    "propagated_inputs",
    "recorded_inputs",
]


@dataclass(frozen=True)
class Work:
    """One (piece, entry) to load or compile."""

    item: SplitItem
    entry: Range
    args: Sequence[Any]
    """Example inputs: symbolic for a range, concrete for an exact size."""
    ctx: CompileContext
    stats: PieceStats
    key: PieceKey
    """Its key in the model's index."""
    exact_args: Callable[[], Sequence[Any]] | None = None
    """The symbolic example inputs as fakes of the build's own fake mode,
    made on demand, when :attr:`args` are Dynamo's recorded ones (same
    shapes and symbols, another fake mode: fine for planning and loading,
    not for compiling)."""
    full_graph: Callable[[], torch.fx.GraphModule] | None = None
    """The piece with every node's recorded value, made on demand, when
    :attr:`item`'s graph comes from the light graph of an ahead-of-time
    entry (the same code; enough to load, not to compile)."""

    @property
    def digest(self) -> str:
        return self.ctx.digest

    def example_inputs(self) -> Sequence[Any]:
        """What a compiler is handed."""
        return self.args if self.exact_args is None else self.exact_args()

    def graph(self) -> torch.fx.GraphModule:
        """The graph a compiler is handed."""
        return self.item.graph if self.full_graph is None else self.full_graph()


@dataclass(frozen=True)
class PiecePlan:
    """Every entry of one compiled piece."""

    item: SplitItem
    token_arg: TokenArg | None
    """Where the token count is among the piece's arguments (``None``: the
    piece does not see it, one entry serves every call)."""
    work: tuple[Work, ...]
    num_pieces: int


def plan_piece(
    config: CompileConfig,
    it: SplitItem,
    args: Sequence[Any],
    stats: PieceStats,
    *,
    store: ArtifactStore | None,
    shared: str,
    compiler_name: str,
    inductor_options: dict[str, Any],
    num_pieces: int,
    sym: Any,
    exact_args: Callable[[], Sequence[Any]] | None = None,
    full_graph: Callable[[], torch.fx.GraphModule] | None = None,
    inductor: InductorFolder | None = None,
) -> PiecePlan:
    """Every entry of piece ``it`` with its example inputs and digest.
    ``sym`` is the token count's symbol; a piece that does not see it is
    compiled once (symbolic in any other size) and serves every call."""
    token_arg = find_token_arg(args, sym)
    entries = (
        config.compile_entries if token_arg is not None else (Range(1, config.max_num_tokens),)
    )
    signature = piece_signature(it.graph)
    meta = [input_meta(a) for a in args]
    work: list[Work] = []
    for entry in entries:
        ex_args: Sequence[Any] = args
        concrete = False
        if entry.is_single_size and token_arg is not None:
            conc = concrete_inputs(args, sym, entry.start)
            if conc is not None:
                ex_args, concrete = conc, True
        pm = PassManager(config.post_grad_passes, entry) if config.post_grad_passes else None
        digest = artifact_digest(
            signature=signature,
            inputs=meta,
            start=entry.start,
            end=entry.end,
            concrete=concrete,
            shared=shared,
            passes=pm.uuid() if pm else None,
            compiler=compiler_name,
        )
        ctx = CompileContext(
            store=store,
            digest=digest,
            inductor_config=inductor_options,
            post_grad_pass=pm,
            inductor=inductor,
        )
        key = PieceKey(entry.start, entry.end, it.index, compiler_name)
        work.append(
            Work(it, entry, ex_args, ctx, stats, key, None if concrete else exact_args, full_graph)
        )
    return PiecePlan(it, token_arg, tuple(work), num_pieces)


def fake_inputs(example_inputs: Sequence[Any], fake_mode: Any) -> list[Any]:
    """The graph inputs as fake tensors of the tracing fake mode (symbolic
    shapes; the mode memoises the fakes Dynamo made)."""
    if fake_mode is None:
        return list(example_inputs)
    return [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in example_inputs]


class PieceInputs:
    """Each compiled piece's arguments as fakes, in the piece's order (not
    Dynamo's).

    For planning (digests, token dims, exact-size inputs) the values
    Dynamo's trace recorded on the nodes the pieces read are used when
    every one has one (split keeps them on the pieces' placeholders) and
    shares the build's shape environment; else, and for compiling when the
    recorded ones belong to another fake mode (Dynamo hands backends a
    fresh one), they come from one fake run of the split module, made on
    first need (a warm start that only loads never makes it)."""

    def __init__(
        self,
        split_gm: torch.fx.GraphModule,
        fake_args: Sequence[Any],
        fake_mode: Any,
        names: set[str],
    ) -> None:
        self._run = (split_gm, fake_args, fake_mode, names)
        self._propagated: dict[str, tuple[Any, ...]] | None = None
        self.recorded = recorded_inputs(split_gm, names, fake_mode) if fake_mode else None
        self.same_mode = self.recorded is not None and all(
            getattr(v, "fake_mode", fake_mode) is fake_mode
            for vals in self.recorded.values()
            for v in vals
        )

    def propagated(self) -> dict[str, tuple[Any, ...]]:
        if self._propagated is None:
            self._propagated = propagated_inputs(*self._run)
        return self._propagated

    def for_planning(self) -> dict[str, tuple[Any, ...]]:
        return self.recorded if self.recorded is not None else self.propagated()

    def exact(self, name: str) -> Callable[[], Sequence[Any]] | None:
        """What :attr:`Work.exact_args` of piece ``name`` is."""
        if self.recorded is None or self.same_mode:
            return None
        return lambda: self.propagated()[name]


def propagated_inputs(
    split_gm: torch.fx.GraphModule,
    fake_args: Sequence[Any],
    fake_mode: Any,
    names: set[str],
) -> dict[str, tuple[Any, ...]]:
    """Each piece's arguments, from running the split module on fake inputs."""
    captured: dict[str, tuple[Any, ...]] = {}

    class Recorder(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            if target in names:
                captured[str(target)] = tuple(args)
            # The piece itself, not what the stitched graph calls now (a
            # built piece's runner, set on the instance).
            sub = split_gm._modules[str(target)]
            if sub is None:  # pragma: no cover - split_module always sets it
                raise KeyError(target)
            if target in names or not isinstance(sub, torch.fx.GraphModule):
                return sub(*args, **kwargs)
            # An eager piece: its outputs in the layouts it returns them in.
            return conform_fakes(sub, sub(*args, **kwargs))

    ctx = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with ctx, torch.no_grad():
        Recorder(split_gm).run(*fake_args)
    return captured


def recorded_inputs(
    split_gm: torch.fx.GraphModule, names: set[str], fake_mode: Any
) -> dict[str, tuple[Any, ...]] | None:
    """Each piece's arguments as Dynamo's trace recorded them on the nodes
    (``example_value``), if every one has one from ``fake_mode`` or a fake
    mode sharing its shape environment (the same symbols)."""
    out: dict[str, tuple[Any, ...]] = {}
    for name in names:
        sub = getattr(split_gm, name, None)
        if not isinstance(sub, torch.fx.GraphModule):
            return None
        vals = []
        for n in sub.graph.find_nodes(op="placeholder"):
            v = n.meta.get("example_value", n.meta.get("val"))
            if isinstance(v, torch.Tensor):
                mode = getattr(v, "fake_mode", None)
                if mode is not fake_mode and (
                    mode is None or mode.shape_env is not fake_mode.shape_env
                ):
                    return None  # not a fake of this trace
            elif not isinstance(v, (torch.SymInt, int, float, bool)):
                return None
            vals.append(v)
        out[name] = tuple(vals)
    return out
