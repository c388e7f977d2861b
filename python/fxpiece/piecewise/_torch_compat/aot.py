"""Dynamo's ahead-of-time compile (``aot_compile`` + ``load_compiled_function``):
capture a model's Dynamo output (bytecode and guards) once, save it, and
call it in a fresh process without tracing again.

The backend's result must be a ``SerializableCallable``: :class:`Piecewise`
is one; it serialises the Dynamo graph and its fake example inputs (with
``GraphPickler``). Torch's loader only unpickles it as data; the caller then
hands its :class:`~fxpiece.piecewise.job.GraphJob` to the backend explicitly
(:meth:`Piecewise.build`), which loads every piece from the cache.

The graph is saved twice: whole, and *light*, with the recorded values
(fake tensors, the slow part of a load) kept only on the nodes the backend
reads when it loads every piece (see
:func:`fxpiece.piecewise.split.boundary_nodes`). A warm start loads the
light graph; the whole one is loaded only if a piece must be compiled
(Inductor's passes read every node's value).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import io
import logging
import pickle
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx

from fxpiece.piecewise.job import FullGraph, GraphJob

__all__ = [
    "AotUnsupported",
    "FullGraph",
    "Piecewise",
    "aot_supported",
    "capture",
    "captured_piecewise",
    "check_guards",
    "current_files",
    "deserialize",
    "frame_scope",
    "graph_state",
    "keep_guards",
    "module_file",
    "serialize",
    "traced_modules",
]

BuildFn = Callable[[GraphJob], Callable[..., Any]]
"""Builds a job's pieces (:meth:`Backend.build <fxpiece.piecewise.backend.Backend.build>`);
returns what the stitched graph calls."""

_DROPPED_META = frozenset({"source_fn_stack", "nn_module_stack", "fwd_source_fn_stack", "grapharg"})
"""Node metadata not saved: stacks of live objects, and Dynamo's graph
arguments (they hold the real input tensors)."""
_VALUE_META = ("example_value", "val")
"""A node's recorded value: left out of the light graph except where kept."""


class AotUnsupported(Exception):
    """Dynamo cannot capture this call ahead of time (a graph break, an
    unpicklable value...); ``str()`` says why."""


AOT_MIN_TORCH = (2, 15)
"""The oldest torch the ahead-of-time start is verified on (its API moved a
lot before); older releases trace with Dynamo on every start."""


def aot_supported() -> str | None:
    """``None`` if this torch can save and load Dynamo's output, else why not."""
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version < AOT_MIN_TORCH:
        return (
            f"torch {torch.__version__} is older than "
            f"{'.'.join(map(str, AOT_MIN_TORCH))}, the first release it is verified on"
        )
    try:
        from torch._dynamo.aot_compile import aot_compile_fullgraph  # noqa: F401
        from torch._dynamo.aot_compile_types import SerializableCallable  # noqa: F401
        from torch.fx._graph_pickler import GraphPickler  # noqa: F401
    except ImportError as e:  # pragma: no cover - a build without it
        return f"torch {torch.__version__} has no ahead-of-time Dynamo compile ({e})"
    if not hasattr(torch.compiler, "load_compiled_function"):  # pragma: no cover
        return f"torch {torch.__version__} has no torch.compiler.load_compiled_function"
    return None


try:
    from torch._dynamo.aot_compile_types import SerializableCallable as _Base
except ImportError:  # pragma: no cover - older torch
    _Base = object  # type: ignore[assignment,misc]


class Piecewise(_Base):
    """The backend's result while capturing ahead of time, and what torch's
    loader unpickles: calls the stitched graph; serialises the Dynamo graph,
    not the pieces.

    It is built explicitly, never by torch: after a capture (once Dynamo has
    said which source files it traced: they enter the model key) and after
    a load, the caller passes the backend's build to :meth:`build`, or a
    function already built to :meth:`serve`."""

    def __init__(
        self,
        state: dict[str, Any],
        captured: tuple[torch.fx.GraphModule, Sequence[Any], Any] | None = None,
    ) -> None:
        self.fn: Callable[..., Any] | None = None
        self.state = state
        """``graph``, ``graph_light`` and ``inputs`` (GraphPickler bytes),
        ``marked``, ``traced_modules`` and the backend's saved key factors."""
        self._captured = captured
        """``(graph, fake inputs, fake mode)`` of a capture in this process."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is None:
            raise RuntimeError(
                "an fxpiece ahead-of-time graph was called before it was built; "
                "it is served by fxpiece.compile only"
            )
        return self.fn(*args, **kwargs)

    def build(self, build: BuildFn) -> None:
        """Build the pieces with ``build`` (the backend's), handing it this
        graph's job, under the context Dynamo gives a backend."""
        job, fake_mode = self._job()
        with _as_in_dynamo(fake_mode):
            self.fn = build(job)
        self._captured = None

    def serve(self, fn: Callable[..., Any]) -> None:
        """Call ``fn`` (pieces already built in this process)."""
        self.fn = fn
        self._captured = None

    def _job(self) -> tuple[GraphJob, Any]:
        state = self.state
        traced = current_files(state["traced_modules"])
        if self._captured is not None:
            gm, fakes, fake_mode = self._captured
            return GraphJob(gm, fakes, traced, state["marked"], saved=state), fake_mode
        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        shape_env = ShapeEnv()
        fake_mode = FakeTensorMode(shape_env=shape_env)
        light = state.get("graph_light")
        with _unlogged_assumptions(shape_env):
            gm = _load_graph(light if light is not None else state["graph"], fake_mode)
            inputs = GraphPickler.loads(state["inputs"], fake_mode)
        if not isinstance(inputs, list):
            raise RuntimeError("an ahead-of-time entry holds no graph inputs")
        full: FullGraph | None = None
        if light is not None:
            full = functools.cache(lambda: _load_graph(state["graph"], fake_mode))
        job = GraphJob(gm, inputs, traced, state["marked"], saved=state, full_graph=full)
        return job, fake_mode

    @classmethod
    def serialize_compile_artifacts(cls, fn: Piecewise) -> bytes:
        return pickle.dumps(fn.state, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Piecewise:
        """Data only: the graph is unpickled and built by :meth:`build`."""
        state = pickle.loads(data)
        if not isinstance(state, dict) or "traced_modules" not in state:
            raise RuntimeError("an ahead-of-time entry holds no fxpiece graph state")
        return cls(state)


@contextlib.contextmanager
def _unlogged_assumptions(shape_env: Any) -> Iterator[None]:
    """While fakes with symbolic sizes are unpickled into ``shape_env``, its
    symbols have no values yet, and each size check falls back to an
    assumption that the shape env logs at INFO with a summary of the user's
    stack, whose first use imports ``torch.export`` and, with it,
    AOTAutograd and Inductor's code cache (about 0.5 s). Unless that log is
    on, this shape env (ours alone) skips the message for the block."""
    from torch.fx.experimental import symbolic_shapes

    if symbolic_shapes.log.isEnabledFor(logging.INFO):
        yield
        return
    shape_env._log_suppressed_dde = lambda *args: None
    try:
        yield
    finally:
        del shape_env._log_suppressed_dde


def _load_graph(data: bytes, fake_mode: Any) -> torch.fx.GraphModule:
    from torch.fx._graph_pickler import GraphPickler

    gm = GraphPickler.loads(data, fake_mode)
    if not isinstance(gm, torch.fx.GraphModule):
        raise RuntimeError("an ahead-of-time entry holds no graph")
    gm.recompile()
    return gm


@contextlib.contextmanager
def _as_in_dynamo(fake_mode: Any) -> Iterator[None]:
    """What a backend runs under when Dynamo calls it: a tracing context
    with the graph's fake mode, the Python dispatcher (symbolic sizes), and
    a top-level timed event (Inductor's cache lookups record into it)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._dynamo.utils import dynamo_timed, get_metrics_context

    with (
        torch._guards.tracing(torch._guards.TracingContext(fake_mode)),
        enable_python_dispatcher(),
        get_metrics_context(),
        dynamo_timed("fxpiece_rebuild"),
    ):
        yield


def graph_state(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], keep_values: set[str] | None = None
) -> dict[str, Any]:
    """The Dynamo graph and its fake inputs as ``GraphPickler`` bytes; with
    ``keep_values`` (node names), also the light graph: recorded values
    only on those nodes (see the module doc)."""
    from torch.fx._graph_pickler import GraphPickler, Options

    opts = Options(ops_filter=None, node_metadata_key_filter=lambda k: k not in _DROPPED_META)
    state = {
        "graph": GraphPickler.dumps(gm, opts),
        "inputs": GraphPickler.dumps(list(example_inputs), opts),
    }
    if keep_values is not None:
        dropped: list[tuple[torch.fx.Node, str, Any]] = []
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output", "get_attr") or node.name in keep_values:
                continue
            dropped += [(node, k, node.meta.pop(k)) for k in _VALUE_META if k in node.meta]
        try:
            state["graph_light"] = GraphPickler.dumps(gm, opts)
        finally:
            for node, k, v in dropped:
                node.meta[k] = v
    return state


def capture(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    record: Callable[[torch.fx.GraphModule, Sequence[Any]], Piecewise],
    inductor_folder: contextlib.AbstractContextManager[Any],
) -> Any:
    """Trace ``fn(*args, **kwargs)`` as one full graph and return Dynamo's
    ahead-of-time compiled function (guards checked by the caller: see
    :func:`check_guards`); ``record`` is the backend Dynamo calls: it
    returns the graph's unbuilt :class:`Piecewise` (see
    :func:`captured_piecewise`). ``inductor_folder`` is entered while
    ``torch.compile`` is set up: it reads Inductor's folder (its bisector can
    swap the backend), which must be the backend's private one, never the
    global default. :class:`AotUnsupported` when it cannot be captured
    (graph break, a value Dynamo cannot save)."""
    scope = frame_scope(fn, args, kwargs)
    with torch._dynamo.config.patch(enable_aot_compile=True), inductor_folder:
        compiled = torch.compile(
            fn,
            fullgraph=True,
            backend=record,
            options={"guard_filter_fn": functools.partial(keep_guards, scope=scope)},
        )
    try:
        out = compiled.aot_compile((tuple(args), dict(kwargs)))  # type: ignore[attr-defined]
    except torch._dynamo.exc.Unsupported as e:
        raise AotUnsupported(f"graph break: {_first_line(e)}") from e
    except torch._dynamo.exc.BackendCompilerFailed:
        raise  # the backend's own error (a bad config, the trust boundary...)
    except Exception as e:
        raise AotUnsupported(f"{type(e).__name__}: {_first_line(e)}") from e
    if scope is not None:
        _import_installed_modules(out, scope["G"])
    out.disable_guard_check()
    return out


def _import_installed_modules(captured: Any, f_globals: dict[str, Any]) -> None:
    """Record, as imports, the modules Dynamo's bytecode reads through a
    global it installed under a per-process name (``___module_collections_<id>_c0``,
    when an inlined function's output is rebuilt with a module its own
    globals do not name). Dynamo's saved output does not record them, so a
    fresh process could not load it ("Missing required external
    references")."""
    env = getattr(getattr(captured, "_artifacts", None), "runtime_env", None)
    if env is None:
        return
    for ref in sorted(getattr(env, "external_refs", ())):
        if ref in env.used_globals or ref in env.import_sources:
            continue
        value = f_globals.get(ref)
        if ref.startswith("___module_") and isinstance(value, types.ModuleType):
            env.import_sources[ref] = value.__name__


def frame_scope(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """What Dynamo's guard sources are evaluated in for a call of ``fn``:
    ``{"L": the frame's locals, "G": its globals}``, as Dynamo's
    ahead-of-time compile binds them (the signature of the function itself,
    not of what it wraps; a bound method's ``self`` first). ``None`` if the
    call does not bind."""
    lead: tuple[Any, ...] = ()
    target: Any = fn
    if inspect.ismethod(fn):
        lead, target = (fn.__self__,), fn.__func__
    code = getattr(target, "__code__", None)
    if code is None:
        return None
    try:
        bound = inspect.signature(target, follow_wrapped=False).bind(*lead, *args, **kwargs)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    f_locals: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, target.__closure__ or (), strict=False):
        with contextlib.suppress(ValueError):  # an empty cell
            f_locals[name] = cell.cell_contents
    f_locals.update(bound.arguments)
    return {"L": f_locals, "G": target.__globals__}


def keep_guards(entries: Sequence[Any], scope: dict[str, Any] | None = None) -> list[bool]:
    """The guards a captured function keeps.

    torch's default for ahead-of-time compiles drops every guard on a
    global, so a module constant baked into the graph (``SCALE = 1.5`` set
    to 2.5 before the call) would not be checked and the saved code would
    compute with the old value. Kept here: every guard on a local (the
    inputs, the module's parameters and attributes), and every guard on a
    global whose value is a plain constant (numbers, strings, ``None``,
    tuples of those). Dropped, since they cannot be saved: guards that
    certify objects by identity (functions, modules, classes, ``torch.ops``
    namespaces), and guards on an object of a class defined in a local
    scope or reached through such a class (``type(m).forward``'s closure):
    such an object is saved as a plain ``nn.Module`` or not at all. Hugging
    Face models hold them (the ``kernels`` package wraps functions in local
    ``Func`` modules). The traced source files are hashed separately, and
    the launch key holds the model's class and parameters. ``scope`` (see
    :func:`frame_scope`) is what the guards' sources are read in; without
    it, guards reached through a class are kept. A capture whose kept guard
    still cannot be saved fails with :class:`AotUnsupported`, and the model
    runs through Dynamo."""
    from torch._dynamo.guards import CheckFunctionManager, _get_closure_vars
    from torch._dynamo.source import TypeSource
    from torch._guards import ChainedSource

    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    cache: dict[Any, Any] = {}

    def through_local_class(e: Any) -> bool:
        if e.has_value and _local_class(type(e.value)):
            return True
        if scope is None:
            return False
        src = getattr(e.orig_guard, "originating_source", None)
        while isinstance(src, ChainedSource):
            if isinstance(src, TypeSource):
                try:
                    value = src.base.get_value(scope, _get_closure_vars(), cache)
                except Exception:
                    return False
                if _local_class(type(value)):
                    return True
            src = src.base
        return False

    def keep(e: Any) -> bool:
        types = {e.guard_type, *getattr(e, "derived_guard_types", ())}
        if types & unsupported or through_local_class(e):
            return False
        return not e.is_global or (e.has_value and _plain_constant(e.value))

    return [keep(e) for e in entries]


def _local_class(t: type) -> bool:
    return t.__qualname__ != t.__name__ and "<locals>" in t.__qualname__


def _plain_constant(v: object, depth: int = 0) -> bool:
    if v is None or isinstance(v, bool | int | float | complex | str | bytes):
        return True
    if isinstance(v, tuple | frozenset) and depth < 4:
        return all(_plain_constant(x, depth + 1) for x in v)
    return False


def serialize(compiled: Any) -> bytes:
    """The bytes of a captured function (Dynamo's format)."""
    try:
        data: bytes = type(compiled).serialize(compiled).serialized_data
    except Exception as e:
        raise AotUnsupported(f"cannot save Dynamo's output: {_first_line(e)}") from e
    return data


def deserialize(data: bytes, f_globals: dict[str, Any]) -> tuple[Any, Piecewise]:
    """Load a captured function and its unbuilt :class:`Piecewise` (build it
    before the first call: :meth:`Piecewise.build` or :meth:`Piecewise.serve`).
    Guard checks are left to the caller (:func:`check_guards`).

    The pieces are built after torch's loader returns, so under the
    caller's Inductor config (their key depends on it), not the loader's
    (it turns ``enable_autograd_for_aot`` on while it unpickles)."""
    fn: Any = torch.compiler.load_compiled_function(io.BytesIO(data), f_globals=f_globals)
    fn.disable_guard_check()
    return fn, captured_piecewise(fn)


def captured_piecewise(captured: Any) -> Piecewise:
    """The backend's result inside a captured function."""
    piece = captured._artifacts.compiled_fn
    if not isinstance(piece, Piecewise):
        raise AotUnsupported(f"the backend returned {type(piece).__name__}, not fxpiece's")
    return piece


def traced_modules(captured: Any) -> dict[str, str]:
    """``{module name: source file}`` of every code object Dynamo traced
    for ``captured``."""
    out = {}
    for src in captured.source_info().inlined_sources:
        path = getattr(sys.modules.get(src.module), "__file__", None)
        if isinstance(path, str):
            out[src.module] = path
    return dict(sorted(out.items()))


def module_file(name: str) -> str | None:
    """The source file module ``name`` is (or would be) imported from now."""
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None) if mod is not None else None
    if path is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        path = spec.origin if spec is not None else None
    return path if isinstance(path, str) else None


def current_files(modules: dict[str, str]) -> list[str]:
    """The files of the traced modules ``{name: file at capture}`` in this
    process: a module is found by name, wherever it is imported from now
    (the model key names files relative to their ``sys.path`` entry, so a
    package moved elsewhere keeps its key)."""
    return sorted({module_file(name) or path for name, path in modules.items()})


def check_guards(fn: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether the captured function's guards accept this call."""
    ok: bool = fn.guard_check(*args, **kwargs)
    return ok


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
