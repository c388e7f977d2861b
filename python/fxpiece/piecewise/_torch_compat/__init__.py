"""Everything that touches torch internals whose names move between releases.

Tested against torch 2.15.0 (``make test``) and 2.9.1, the oldest release
of the range declared in ``pyproject.toml`` (``make test-compat``); 2.13.0
was checked by hand. Other modules import torch internals only through here.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import shlex
import subprocess
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx

from fxpiece import gc_pause
from fxpiece.cache.safeio import read_regular
from fxpiece.piecewise._torch_compat.loading import (
    LoadedArtifact,
    grad_off_call,
    load_standalone_bytes,
    unpacking,
)

__all__ = [
    "VERIFIED_TORCH",
    "CustomGraphPassBase",
    "InductorDirs",
    "LoadedArtifact",
    "bisect_backend_in",
    "compile_standalone",
    "cpp_compiler",
    "cpu_vec_isa",
    "detect_fake_mode",
    "force_disable_caches",
    "freezing_enabled",
    "global_inductor_paths",
    "grad_off_call",
    "graph_partition_supported",
    "inductor_compile_threads",
    "inductor_config_patch",
    "inductor_config_portable",
    "inductor_default_dir",
    "inductor_guards_size_one",
    "inductor_option_names",
    "load_standalone_bytes",
    "mark_token_dim",
    "marked_dims",
    "prepare_inductor",
    "resolve_dynamic",
    "set_token_dims",
    "standalone_bytes",
    "token_dims_context",
    "traced_files",
    "unpacking",
]

# Inductor (and with it Dynamo) comes in here: see fxpiece.gc_pause.
with gc_pause.paused():
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass as CustomGraphPassBase
    except ImportError:  # pragma: no cover - older torch
        CustomGraphPassBase = object  # type: ignore[assignment,misc]


def inductor_config_portable() -> dict[str, Any]:
    """Inductor's config as a plain dict (a copy; cheap: no lazy imports,
    unlike ``save_config_portable``, which imports the autotuning stack)."""
    return dict(torch._inductor.config.get_config_copy())


def inductor_option_names() -> frozenset[str]:
    """Every ``torch._inductor.config`` option name."""
    return frozenset(torch._inductor.config.get_config_copy())


def freezing_enabled(overrides: Mapping[str, Any]) -> bool:
    """Whether Inductor's ``freezing`` is on (globally or in ``overrides``)."""
    return bool(overrides.get("freezing", torch._inductor.config.freezing))


def force_disable_caches() -> bool:
    """Inductor's (``torch.compiler.config``'s) switch that turns every cache off."""
    return bool(getattr(torch._inductor.config, "force_disable_caches", False))


def cpu_vec_isa() -> dict[str, Any]:
    """What decides the vector ISA Inductor's C++ codegen targets on this CPU,
    without Inductor's probe (which compiles test programs in its cache
    folder): ATen's CPU capability and the CPU's feature flags."""
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = sorted(set(line.split(":", 1)[1].split()))
                    break
    except OSError:  # pragma: no cover - not Linux
        pass
    return {"aten": torch.backends.cpu.get_cpu_capability(), "cpu_flags": flags}


def cpp_compiler() -> str:
    """The C++ compiler Inductor compiles with
    (``torch._inductor.cpp_builder.get_cpp_compiler``). On Linux, found as
    Inductor finds it (the first of ``config.cpp.cxx`` that answers
    ``--version``) without importing its code cache, which a warm start
    does not otherwise need; elsewhere, and for a conda-installed g++,
    Inductor's own search."""
    from torch._inductor import config as cfg

    cxx = cfg.cpp.cxx
    search = tuple(cxx) if isinstance(cxx, list | tuple) else (cxx,)
    plain = (
        sys.platform == "linux"
        and not cfg.is_fbcode()  # type: ignore[attr-defined]
        and getattr(cfg.aot_inductor, "cross_target_platform", None) != "windows"
        and not (None in search and os.environ.get("TORCH_INDUCTOR_INSTALL_GXX"))
    )
    if plain:
        for name in search:
            if not isinstance(name, str) or not shlex.split(name):
                continue
            try:
                subprocess.check_output([*shlex.split(name), "--version"])
                return name
            except (OSError, subprocess.SubprocessError):
                continue
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return str(get_cpp_compiler())
    except Exception:  # pragma: no cover
        return os.environ.get("CXX", "c++")


def traced_files() -> list[str]:
    """Source files of every code object Dynamo traced for the graph being
    compiled (call from inside a backend)."""
    from torch._guards import TracingContext

    get = getattr(TracingContext, "get_traced_code", None)
    codes = get() if get is not None else None
    if not codes:
        return []
    return sorted({c.co_filename for c in codes})


TOKEN_DIMS_ATTR = "_fxpiece_token_dims"
"""The attribute :func:`set_token_dims` leaves on a tensor."""


def set_token_dims(t: torch.Tensor, dims: Sequence[int]) -> None:
    """Record which of ``t``'s dynamic dims are token dims (the others, such
    as a KV cache's length, vary too but are not dispatched on)."""
    setattr(t, TOKEN_DIMS_ATTR, frozenset(dims))


def marked_dims(gm: torch.fx.GraphModule) -> list[tuple[int, int]]:
    """``(graph input, dim)`` of every token dim the user marked on the real
    tensors Dynamo traced, in input order: the dims :func:`set_token_dims`
    recorded if any input has them, else every dim marked dynamic (backed or
    unbacked: a caller of ``torch.compile`` that marked dims itself)."""
    examples: list[tuple[int, torch.Tensor]] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        arg = node.meta.get("grapharg")
        example = getattr(arg, "example", None) if arg is not None else None
        if isinstance(example, torch.Tensor) and not isinstance(example, torch.nn.Parameter):
            examples.append((i, example))
    if any(hasattr(t, TOKEN_DIMS_ATTR) for _, t in examples):
        return [(i, d) for i, t in examples for d in sorted(getattr(t, TOKEN_DIMS_ATTR, ()))]
    out: list[tuple[int, int]] = []
    for i, t in examples:
        dims: set[int] = set()
        for attr in ("_dynamo_unbacked_indices", "_dynamo_dynamic_indices"):
            dims |= set(getattr(t, attr, ()) or ())
        out.extend((i, d) for d in sorted(dims))
    return out


def detect_fake_mode(inputs: Sequence[Any]) -> Any:
    from torch._guards import detect_fake_mode as detect

    return detect(list(inputs))


def global_inductor_paths() -> dict[str, str]:
    """Folders this torch release's Inductor uses outside ``TORCHINDUCTOR_CACHE_DIR``
    on CPU, by what they hold (found by tracing every file a cold and a warm
    compile open, ``strace -f``, on 2.15.0 and 2.9.1, and every folder created,
    with an audit hook); :class:`InductorDirs` redirects each of them:

    - ``precompiled_headers``: C++ headers every kernel is compiled with
      (``-include``), a module constant from the per-user default folder;
    - ``bisect``: the compiler bisector's status file, which
      ``torch.compile`` reads *before* any backend runs: a ``backend=`` line
      replaces the backend given (``TORCHINDUCTOR_CACHE_DIR``, else the
      per-user default folder).

    Compiler temporaries (gcc's ``cc*.o``, Python's ``tempfile``) are created
    with ``O_EXCL`` under random names, so they are safe in a shared ``/tmp``."""
    from torch._inductor import codecache

    return {
        "precompiled_headers": str(codecache._HEADER_DIR),
        "bisect": os.path.join(inductor_default_dir(), "bisect"),
    }


def inductor_default_dir() -> str:
    """The folder Inductor uses outside fxpiece's blocks:
    ``TORCHINDUCTOR_CACHE_DIR``, else ``<TMPDIR>/torchinductor_<user>``
    (computed as torch does, without creating it)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())


def bisect_backend_in(folder: str) -> str | None:
    """The backend a compiler-bisector status file in Inductor's ``folder``
    would make ``torch.compile`` use instead of the one it is given, if any."""
    from torch._inductor.compiler_bisector import SUBDIR_NAME

    try:  # no FIFO, device or symlink followed: the folder may be hostile
        data = read_regular(Path(folder) / SUBDIR_NAME / "bisect_status.txt", 1 << 16)
        lines = data.decode().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    found = [ln.strip().split("=", 1)[1] for ln in lines if ln.startswith("backend=")]
    return found[0] if found else None


@contextlib.contextmanager
def _environ(key: str, value: str) -> Iterator[None]:
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


class InductorDirs:
    """Inductor's folders for one backend: its cache folder (``cache``) and
    every folder it keeps outside it (:func:`global_inductor_paths`: the
    precompiled C++ headers, ``headers``), applied for a block by
    :meth:`active`. Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` on every use;
    the header folder is a module constant of Inductor's code cache, patched
    for the block, and ``_precompile_header`` (which memoises the header's
    path process-wide) is replaced for the block by this object's own memo,
    so a path in another folder (Inductor's global one, from a compile
    outside fxpiece) is never reused, and a compile outside fxpiece never
    gets ours.

    The code cache is patched when the block starts if it is imported, else
    by :meth:`prepare`, which runs before anything compiles or loads through
    Inductor's caches: a warm start whose pieces all load directly never
    imports Inductor's compiler."""

    def __init__(self, cache: str, headers: str) -> None:
        self.cache = cache
        self.headers = headers
        self._precompile: Any = None
        """Inductor's `_precompile_header`, memoised for this object's folders."""
        self._block: contextlib.ExitStack | None = None
        """The active block's undo steps (``None``: not active)."""
        self._patched = False
        """Whether the code cache is patched for the active block."""

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        if self._block is not None:  # nested in an active block: already applied
            yield
            return
        with contextlib.ExitStack() as block:
            block.enter_context(_environ("TORCHINDUCTOR_CACHE_DIR", self.cache))
            self._block = block
            try:
                if "torch._inductor.codecache" in sys.modules:
                    self._patch_code_cache(block)
                yield
            finally:
                self._block = None

    def patch(self) -> None:
        """Inside :meth:`active`, before anything uses Inductor's code cache
        (a compile, a load through its caches, the ISA probe): the cache
        imported and patched for the block."""
        if self._block is None:
            raise RuntimeError("InductorDirs.patch() outside an active() block")
        if not self._patched:
            self._patch_code_cache(self._block)

    def prepare(self) -> None:
        """Before Inductor compiles or loads through its caches, inside
        :meth:`active`: :meth:`patch`, and Inductor's compiler imported
        (:func:`prepare_inductor`)."""
        self.patch()
        prepare_inductor()

    def _patch_code_cache(self, block: contextlib.ExitStack) -> None:
        from torch._inductor import codecache

        if self._precompile is None:
            self._precompile = functools.cache(codecache._precompile_header.__wrapped__)
        saved = (codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR, codecache._precompile_header)
        codecache._HEADER_DIR = self.headers
        codecache._HEADER_LOCK_DIR = os.path.join(self.headers, "locks")
        codecache._precompile_header = self._precompile
        self._patched = True

        def undo() -> None:
            (codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR, codecache._precompile_header) = (
                saved
            )
            self._patched = False

        block.callback(undo)


@contextlib.contextmanager
def inductor_config_patch(options: Mapping[str, Any]) -> Iterator[None]:
    with torch._inductor.config.patch(dict(options)):
        yield


def graph_partition_supported() -> bool:
    cfg = torch._inductor.config
    return hasattr(cfg, "graph_partition") and hasattr(cfg, "custom_should_partition_ops")


def compile_standalone(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    dynamic: bool,
    options: Mapping[str, Any],
) -> Any:
    """``torch._inductor.standalone_compile``: symbolic shapes from the
    tracing context (``dynamic``) or the example inputs' concrete shapes."""
    from torch._inductor import standalone_compile

    return standalone_compile(
        gm,
        list(example_inputs),
        dynamic_shapes="from_tracing_context" if dynamic else "from_example_inputs",
        options=dict(options),
    )


def standalone_bytes(artifact: Any) -> bytes | None:
    """The bytes ``CompiledArtifact.save(format="binary")`` would write, or
    ``None`` if the artifact cannot be saved."""
    is_saveable = getattr(artifact, "is_saveable", None)
    if is_saveable is not None and not is_saveable():
        return None
    to_bytes = getattr(artifact, "_to_binary_bytes", None)
    if to_bytes is not None:
        return bytes(to_bytes())
    # Older releases: save to a temp file and read it back.  # pragma: no cover
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "artifact.bin")
        artifact.save(path=p, format="binary")
        with open(p, "rb") as f:
            return f.read()


class _AlwaysHitShapeEnv:
    """Stands in for the shape env when looking up Inductor's FX graph cache:
    our own key already decided that this entry is the one to use."""

    def __init__(self) -> None:
        self.guards: list[Any] = []
        self.var_to_hint_override: dict[Any, Any] = {}

    def evaluate_guards_expression(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def get_pruned_guards(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def produce_guards_expression(self, *args: Any, **kwargs: Any) -> str:
        return ""


@contextlib.contextmanager
def _static_tracing() -> Iterator[None]:
    """A fresh tracing context whose fake mode specialises every shape."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with tracing(TracingContext(FakeTensorMode(shape_env=ShapeEnv()))):
        yield


def prepare_inductor() -> None:
    """Import Inductor's compiler (about 1 s here), as
    ``torch.compile(backend="inductor")`` does when it is called, and start
    hashing torch's sources (``torch_key``, which every usual load checks an
    artifact against: 0.23 s here) in torch's background thread, where the
    release offers it. Once per process."""
    if "torch._inductor.compile_fx" in sys.modules:
        return
    import torch._inductor.compile_fx  # noqa: F401
    from torch._inductor.codecache import torch_key

    prefetch = getattr(torch_key, "prefetch", None)
    if callable(prefetch):
        prefetch()


def compile_fx_cached(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    dynamic: bool,
    options: Mapping[str, Any],
) -> tuple[Callable[..., Any], str | None]:
    """Compile with ``compile_fx`` through Inductor's FX graph cache.

    Returns ``(fn(*args), fx_graph_cache_key)``.
    """
    from unittest.mock import patch

    import torch._inductor.codecache as codecache
    import torch._inductor.compile_fx as cfx

    captured: dict[str, Any] = {}

    def inner(*args: Any, **kwargs: Any) -> Any:
        out = cfx.compile_fx_inner(*args, **kwargs)
        captured["key"] = getattr(out, "_fx_graph_cache_key", None)
        return out

    with contextlib.ExitStack() as st:
        if not dynamic:
            st.enter_context(_static_tracing())
        st.enter_context(
            patch.object(codecache.FxGraphCache, "_check_can_cache", lambda *a, **k: None)
        )
        st.enter_context(torch._inductor.config.patch(fx_graph_remote_cache=False))
        st.enter_context(
            torch._functorch.config.patch(
                enable_autograd_cache=False, enable_remote_autograd_cache=False
            )
        )
        st.enter_context(torch._inductor.config.patch(dict(options)))
        # compile_fx rewrites the graph's output in place: give it a copy.
        compiled = cfx.compile_fx(
            copy.deepcopy(gm),
            list(example_inputs),
            inner_compile=inner,
            config_patches={"fx_graph_cache": True},
        )
    fn: Callable[..., Any] = compiled  # type: ignore[assignment]
    return fn, captured.get("key")


def load_fx_cached(key: str, example_inputs: Sequence[Any]) -> Callable[..., Any] | None:
    """Look ``key`` up in Inductor's FX graph cache; ``fn(list_of_args)`` or
    ``None`` on a miss."""
    from unittest.mock import patch

    from torch._inductor.codecache import FxGraphCache
    from torch._inductor.output_code import CompiledFxGraphConstants

    with (
        patch.object(FxGraphCache, "_get_shape_env", lambda *a, **k: _AlwaysHitShapeEnv()),
        torch._dynamo.utils.get_metrics_context(),
    ):
        graph, _info = FxGraphCache._lookup_graph(
            key, list(example_inputs), True, None, CompiledFxGraphConstants()
        )
    if graph is None:
        return None
    out: Callable[..., Any] = graph
    return out


VERIFIED_TORCH = ("2.9.1", "2.13.0", "2.15.0")
"""The torch releases the backend's tests were run against (``make test`` and
``make test-compat``); the declared range is in ``pyproject.toml``."""


def resolve_dynamic(mode: str) -> str:
    """``"backed"`` or ``"unbacked"``: what ``mode`` means on the installed torch.

    ``"auto"`` is ``"unbacked"`` on every release in the declared range
    (2.9 to 2.15; verified on :data:`VERIFIED_TORCH`): unbacked sizes are
    never specialised, so one graph serves every token count without
    touching Dynamo's global config. Both modes give one graph for every
    token count, 0 and 1 included, on those releases. (Kept free of
    :mod:`fxpiece.config`, which calls it: every mode of
    ``fxpiece.config.DYNAMIC_MODES`` resolves, a test checks.)"""
    if mode == "auto":
        return "unbacked"
    if mode in ("backed", "unbacked"):
        return mode
    raise ValueError(f"unknown dynamic mode {mode!r}; use auto, backed or unbacked")


def mark_token_dim(t: torch.Tensor, dim: int, mode: str = "auto") -> None:
    """Mark ``dim`` of ``t`` dynamic the way token dims are (``mode``: see
    :func:`resolve_dynamic`); varying dims (a KV cache's length) are marked
    the same way, and :func:`set_token_dims` says which are token dims.

    - ``"unbacked"``: ``mark_unbacked``; the size has no hint and is never
      specialised, so 0 and 1 go through the one graph.
    - ``"backed"``: ``mark_dynamic``; Dynamo would specialise sizes 0 and 1
      (each its own graph), unless the call runs under
      :func:`token_dims_context` (``backed_size_oblivious``), which
      :class:`fxpiece.api.CompiledModel` does; Inductor may still guard the
      size against 1 (:func:`inductor_guards_size_one`)."""
    if resolve_dynamic(mode) == "unbacked":
        from torch._dynamo.decorators import mark_unbacked

        mark_unbacked(t, dim)
    else:
        torch._dynamo.mark_dynamic(t, dim)


def inductor_guards_size_one() -> bool:
    """Whether Inductor guards a backed size against 1 on every broadcast,
    equal shapes included (``broadcast_symbolic_shapes`` without the
    equal-shapes shortcut: torch 2.9.1; not 2.13.0 nor 2.15.0). Then, with
    backed token dims, a token count of 1 always gets a Dynamo graph of its
    own (the guard's value is the first call's size). Newer releases guard
    only when a broadcast really mixes the token dim with a size-1 dim."""
    import inspect

    from torch._inductor import lowering

    try:
        src = inspect.getsource(lowering.broadcast_symbolic_shapes)
    except (OSError, TypeError):  # pragma: no cover - no source shipped
        return True
    return "a == b" not in src


@contextlib.contextmanager
def token_dims_context(mode: str = "auto") -> Iterator[None]:
    """What a call with token dims marked in ``mode`` runs under (Dynamo
    traces inside it). For backed dims: symbolic shapes'
    ``backed_size_oblivious``, so a backed size is not specialised when it
    is 0 or 1 (one graph for every token count, as with unbacked dims; the
    option exists, under that name, in torch 2.9 to 2.15). Nothing for
    unbacked dims."""
    if resolve_dynamic(mode) == "unbacked":
        yield
        return
    from torch.fx.experimental import _config as fx_config

    # ``patch`` is installed at import by ``install_config_module`` (untyped).
    with fx_config.patch(backed_size_oblivious=True):  # type: ignore[attr-defined]
        yield


# -- what enters the cache key --------------------------------------------------

ENV_CHANGES_CODE = frozenset(
    {
        "ATEN_CPU_CAPABILITY",  # the ISA ATen's kernels and Inductor's codegen target
        "TORCH_BF16_REDUCED_PRECISION",
        "TORCHINDUCTOR_DEBUG_COMPILE",  # read by cpp_builder: -O0 -g
        "TORCHINDUCTOR_DEBUG_SYMBOL",
        "TORCHINDUCTOR_FX_COMPILE_MODE",
        "TORCHINDUCTOR_PATTERN_MATCH_BACKEND",
        "CXX",  # which C++ compiler Inductor runs
    }
)
"""Environment variables read outside ``torch._inductor.config`` that change
generated code (every ``TORCHINDUCTOR_*`` option backed by the config is
keyed through the config)."""

INDUCTOR_NOT_IN_KEY = frozenset(
    {
        # where things are written, and which caches are used
        "_cache_config_ignore_prefix",
        "_profile_var",
        "aot_inductor.output_path",
        "autoheuristic_log_path",
        "autotune_local_cache",
        "autotune_remote_cache",
        "bundle_triton_into_fx_graph_cache",
        "bundled_autotune_remote_cache",
        "cpp_cache_precompile_headers",
        "cuda.binary_remote_cache_force_write",
        "cuda.cutlass_dir",
        "cuda.upload_to_binary_remote_cache",
        "cuda.use_binary_remote_cache",
        "cutlass.binary_remote_cache_force_write",
        "cutlass.cutlass_dir",
        "cutlass.upload_to_binary_remote_cache",
        "cutlass.use_binary_remote_cache",
        "fx_graph_cache",
        "fx_graph_remote_cache",
        "global_cache_dir",
        "non_blocking_remote_cache_write",
        "remote_gemm_autotune_cache",
        "rocm.ck_dir",
        "xpu.binary_remote_cache_force_write",
        "xpu.cutlass_dir",
        "xpu.upload_to_binary_remote_cache",
        "xpu.use_binary_remote_cache",
        # how many workers compile, and how they log
        "compile_threads",
        "compile_worker_mode",
        "compile_worker_wait_timeout",
        "file_lock_timeout",  # how long a lock is waited for
        "precompilation_timeout_seconds",
        "collective_benchmark_timeout",
        "compile_worker_watchdog_interval_seconds",
        "torchinductor_worker_logpath",
        "worker_log_path",
        "worker_start_method",
        "worker_suppress_logging",
        "log_tlparse",
        # debug output written next to the compile (trace.*)
        "trace.compile_profile",
        "trace.debug_dir",
        "trace.debug_log",
        "trace.dot_graph_shape",
        "trace.draw_orig_fx_graph",
        "trace.enabled",
        "trace.fx_graph",
        "trace.fx_graph_transformed",
        "trace.graph_diagram",
        "trace.graph_diagram_format",
        "trace.info_log",
        "trace.ir_post_fusion",
        "trace.ir_pre_fusion",
        "trace.log_autotuning_results",
        "trace.log_url_for_graph_xform",
        "trace.orig_fx_graph_diagram_format",
        "trace.output_code",
        "trace.provenance_tracking_level",
        "trace.provenance_tracking_max_events",
        "trace.provenance_tracking_to_timeline",
        "trace.save_real_tensors",
        "trace.upload_tar",
    }
)
"""Inductor options that never change generated code (exact names): cache
and output locations, cache switches, compile workers, logging and debug
traces. Every other option enters the key."""


def runtime_factors() -> dict[str, Any]:
    """Process-wide settings that change generated code."""
    return {
        "threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "mkldnn": bool(torch.backends.mkldnn.enabled),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }


def _source_file(fn: Any) -> str | None:
    import inspect

    try:
        path = inspect.getsourcefile(inspect.unwrap(fn))
    except (TypeError, OSError, ValueError):
        return None
    return os.path.abspath(path) if path and os.path.isfile(path) else None


def _code_file(code: Any) -> str | None:
    path = getattr(code, "co_filename", "")
    return os.path.abspath(path) if path and os.path.isfile(path) else None


def _op_implementations(target: Any) -> list[Any]:
    """Python functions behind an operator: a custom op's kernels, fake and
    autograd implementations, Python kernels, fake implementations by any
    API (``register_fake``, ``impl_abstract``), user decompositions and
    lowerings. Kernels the dispatcher holds (``Library.impl``,
    ``torch.library.impl``, ``register_kernel``, ``register_autograd``) are
    in :func:`implementation_files` (:mod:`.registrations`)."""
    from torch._library import custom_ops, simple_registry

    packet = target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target
    qualname = packet._qualified_op_name
    fns: list[Any] = []
    opdef = custom_ops.OPDEFS.get(qualname)
    if opdef is not None:
        fns += [opdef._init_fn, opdef._abstract_fn, opdef._setup_context_fn, opdef._backward_fn]
        fns += list(opdef._backend_fns.values())
    overloads = [getattr(packet, name) for name in packet.overloads()]
    for op in overloads:
        fns += list(getattr(op, "py_kernels", {}).values())
        entry = simple_registry.singleton.find(op.name())
        fns += [k.func for k in entry.fake_impl.kernels]
    from torch._decomp import decomposition_table
    from torch._inductor import decomposition, lowering

    for table in (decomposition_table, decomposition.decompositions, lowering.lowerings):
        for op in (packet, *overloads):
            fn = table.get(op)
            if fn is not None:
                fns.append(fn)
    return [f for f in fns if f is not None]


def _graph_targets(gm: torch.fx.GraphModule) -> Iterator[Any]:
    """``call_function`` targets of ``gm`` and of its subgraphs (the bodies
    of higher-order ops are submodules)."""
    for mod in gm.modules():
        graph = getattr(mod, "graph", None)
        if isinstance(graph, torch.fx.Graph):
            for node in graph.nodes:
                if node.op == "call_function":
                    yield node.target


def _no_source(op: str, what: str) -> Any:
    from fxpiece.errors import ConfigError

    return ConfigError(
        "cache",
        f"{op}: {what} has no source file, so the cache cannot tell when it changes. "
        "Define it in a .py file, or give the function a uuid() that changes with it "
        "(fn.uuid = lambda: '<version>'), or disable the cache (disable_cache=True)",
    )


def _uuid_of(fn: Any) -> str | None:
    uuid = getattr(fn, "uuid", None)
    return str(uuid()) if callable(uuid) else None


def implementation_files(gm: torch.fx.GraphModule) -> set[str]:
    """Source files (outside torch) of the Python code that what ``gm`` calls
    runs or is rewritten into: it can change the compiled code without
    Dynamo ever tracing those files. Every registration API counts
    (:func:`_op_implementations`, and the dispatcher's Python kernels of any
    dispatch key). An implementation outside torch without a source file
    (made by ``exec``, a builtin) and without a ``uuid()`` is a
    :class:`~fxpiece.ConfigError`; :func:`implementation_uuids` keys those
    with one."""
    return implementation_sources(gm)[0]


def implementation_uuids(gm: torch.fx.GraphModule) -> dict[str, str]:
    """``{op: uuid}`` of implementations keyed by an explicit ``uuid()``."""
    return implementation_sources(gm)[1]


def _add_implementation(
    fn: Any, label: str, torch_dir: str, files: set[str], uuids: dict[str, str]
) -> None:
    """Record ``fn``, an implementation behind ``label``: its ``uuid()`` into
    ``uuids``, else its source file into ``files`` (torch's own: nothing). A
    function outside torch with neither is a :class:`~fxpiece.ConfigError`."""
    path = _source_file(fn)
    if path is not None and path.startswith(torch_dir):
        return
    uuid = _uuid_of(fn)
    if uuid is not None:
        uuids[label] = uuid
    elif path is not None:
        files.add(path)
    elif isinstance(fn, types.FunctionType) and not str(fn.__module__).startswith("torch"):
        raise _no_source(label, f"implementation {fn.__qualname__}")


def _add_dispatcher_kernels(
    op: torch._ops.OpOverload, torch_dir: str, files: set[str], uuids: dict[str, str]
) -> None:
    """Record the dispatcher's Python kernels of ``op`` (their files, or the
    ``uuid()`` of one without a file) and the functions they call, as
    :func:`_add_implementation` does. Outside the core namespaces, a kernel
    that cannot be inspected is a :class:`~fxpiece.ConfigError`."""
    from fxpiece.piecewise._torch_compat.registrations import CORE_NAMESPACES, dispatcher_impls

    ns = op.namespace
    try:
        impls = list(dispatcher_impls(op))
    except (TypeError, RuntimeError) as e:
        if ns in CORE_NAMESPACES:
            return
        raise _no_source(op.name(), f"a Python kernel that cannot be inspected ({e})") from e  # type: ignore[no-untyped-call]
    for impl in impls:
        label = f"{impl.op} ({impl.key})"
        if impl.code is None:
            if ns not in CORE_NAMESPACES:
                raise _no_source(label, "a kernel that is not a Python function")
            continue
        path = _code_file(impl.code)
        if path is not None and not path.startswith(torch_dir):
            files.add(path)
        elif path is None:
            fn = _function_of(impl.code)
            uuid = _uuid_of(fn) if fn is not None else None
            if uuid is None:
                raise _no_source(label, f"kernel {impl.code.co_name}")
            uuids[label] = uuid
        for fn in impl.functions:
            _add_implementation(fn, label, torch_dir, files, uuids)


def implementation_sources(gm: torch.fx.GraphModule) -> tuple[set[str], dict[str, str]]:
    """(files, ``{op/key: uuid}``) of every Python implementation behind
    what ``gm`` calls; see :func:`implementation_files`."""
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    out: set[str] = set()
    uuids: dict[str, str] = {}
    seen: set[int] = set()
    for t in _graph_targets(gm):
        if id(t) in seen:
            continue
        seen.add(id(t))
        if not isinstance(t, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
            _add_implementation(t, getattr(t, "__qualname__", repr(t)), torch_dir, out, uuids)
            continue
        for fn in _op_implementations(t):
            _add_implementation(fn, str(t), torch_dir, out, uuids)
        ops = (
            [t] if isinstance(t, torch._ops.OpOverload) else [getattr(t, n) for n in t.overloads()]  # type: ignore[no-untyped-call]
        )
        for op in ops:
            _add_dispatcher_kernels(op, torch_dir, out, uuids)
    return out, uuids


def _function_of(code: Any) -> Any:
    """The function object running ``code`` (for its ``uuid()``)."""
    import gc

    for ref in gc.get_referrers(code):
        if isinstance(ref, types.FunctionType) and ref.__code__ is code:
            return ref
    return None


def inductor_compile_threads() -> int:
    """Threads one Inductor compile uses (``compile_threads``, decided by
    Inductor from the cores and ``TORCHINDUCTOR_COMPILE_THREADS``)."""
    import torch._inductor.config as cfg

    n = getattr(cfg, "compile_threads", None)
    if not isinstance(n, int) or n < 1:
        decide = getattr(cfg, "decide_compile_threads", None)
        n = decide() if callable(decide) else 1
    return max(1, int(n))
