"""The factors of the cache key, gathered from torch, the config and the
environment: everything that can change what a compile produces. The key
formula itself lives in :mod:`fxpiece.cache.keys`.

Six groups of factors (:class:`~fxpiece.cache.keys.KeyFactors`):

- ``env``: an explicit allow-list of environment variables that change
  generated code (never ports, ranks, HOME, paths or other per-process values);
- ``config``: every :class:`~fxpiece.CompileConfig` field that changes compiled
  code (no paths; each field declares it, see
  :func:`fxpiece.config.config_factors`, defined there and re-exported
  here with :func:`~fxpiece.config.factor_value`), the resolved Inductor
  options (minus paths and logging), and the Dynamo graph itself (its code and input metadata);
- ``code``: every source file Dynamo traced for the graph (``hash_files``);
- ``compiler``: torch version and build, Python, machine, CPU vector ISA, the
  C++ compiler, and the compiler adaptor's own hash.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch

import fxpiece
from fxpiece.cache.keys import GROUPS, KeyFactors
from fxpiece.config import CompileConfig, config_factors, factor_value
from fxpiece.hashing import hash_factors, hash_files_report
from fxpiece.piecewise import _torch_compat

__all__ = [
    "code_factor",
    "compiler_factors",
    "config_factors",
    "env_factors",
    "factor_value",
    "graph_factor",
    "input_meta",
    "make_key_factors",
    "piece_signature",
    "portable_path",
]


def env_factors(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables that change generated code and are set: the
    code-changing half of the one classification of every variable torch
    reads (:mod:`fxpiece.piecewise.env_classes`), plus ``ATEN_CPU_CAPABILITY``
    and ``CXX``. Ports, ranks, paths, locks, timeouts, logging and the like
    never enter the key."""
    from fxpiece.piecewise import env_classes

    e = os.environ if env is None else env
    names = env_classes.ENV_CHANGES_CODE | env_classes.OTHER_ENV_CHANGES_CODE
    return {k: e[k] for k in sorted(names) if k in e}


def inductor_factors(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Inductor's resolved config with ``overrides`` applied: every option
    but an exact deny list of paths, logging and cache switches
    (:data:`_torch_compat.INDUCTOR_NOT_IN_KEY`); custom pass hooks by their
    ``uuid()``."""
    cfg = _torch_compat.inductor_config_portable()
    cfg.update(overrides)
    deny = _torch_compat.INDUCTOR_NOT_IN_KEY
    return {k: factor_value(k, v) for k, v in sorted(cfg.items()) if k not in deny}


@functools.lru_cache(maxsize=1)
def _cxx_version() -> str:
    cxx = _torch_compat.cpp_compiler()
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=10)
        return f"{cxx}: {out.stdout.splitlines()[0] if out.stdout else out.returncode}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cxx}: unavailable ({type(e).__name__})"


def compiler_factors(compiler_hash: str) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "torch_cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "system": platform.system(),
        "machine": platform.machine(),
        "vec_isa": _torch_compat.cpu_vec_isa(),
        "cxx": _cxx_version(),
        "adaptor": compiler_hash,
        "fxpiece": fxpiece.__version__,
        "runtime": _torch_compat.runtime_factors(),
    }


def graph_factor(gm: torch.fx.GraphModule, example_inputs: Iterable[Any]) -> str:
    """Digest of the Dynamo graph's code and its inputs' metadata, so two
    graphs of one model (a graph break) never share entries."""
    return hash_factors({"code": gm.code, "inputs": [input_meta(a) for a in example_inputs]})


def input_meta(a: Any) -> Any:
    """JSON-like metadata of one graph input: what compiled code depends on."""
    if isinstance(a, torch.Tensor):
        return {
            "dtype": str(a.dtype),
            "shape": [str(s) for s in a.shape],
            "stride": [str(s) for s in a.stride()],
            "device": a.device.type,
            "requires_grad": a.requires_grad,
        }
    if isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool):
        return {"sym": type(a).__name__}
    if isinstance(a, int | float | bool) or a is None:
        return {"const": a}
    return {"type": type(a).__name__}


def portable_path(path: str) -> str:
    """``path`` relative to the ``sys.path`` entry holding it (site-packages,
    the project's root), so the same files at another place key the same."""
    best = ""
    for entry in sys.path:
        base = os.path.abspath(entry or os.curdir)
        if path.startswith(base + os.sep) and len(base) > len(best):
            best = base
    return os.path.relpath(path, best) if best else path


def code_factor(traced_files: Iterable[str], gm: torch.fx.GraphModule) -> dict[str, Any]:
    """Every source file Dynamo traced, and the files of every Python
    implementation of what the graph calls (custom ops' kernels and fake
    implementations, user decompositions and lowerings, functions allowed in
    the graph): by content and portable path. Op implementations are found
    for every registration API (``custom_op``, ``Library.impl`` for any
    dispatch key, ``torch.library.impl``, ``register_kernel``,
    ``register_fake``/``impl_abstract``, ``register_autograd``); one
    without a source file is keyed by its ``uuid()`` or is a
    :class:`~fxpiece.ConfigError`."""
    traced_files = list(traced_files)
    impl, uuids = _torch_compat.implementation_sources(gm)
    report = hash_files_report(sorted(set(traced_files) | impl))
    by_path = {portable_path(f.path): f.digest for f in report.files}
    impl_paths = {portable_path(p) for p in impl}
    out: dict[str, Any] = {
        "digest": hash_factors(by_path),
        "implementations": hash_factors({p: d for p, d in by_path.items() if p in impl_paths}),
        # Files keyed only as op implementations (Dynamo never traced them).
        "implementation_files": sorted(impl_paths - {portable_path(p) for p in traced_files}),
        "files": by_path,
    }
    if uuids:
        out["implementation_uuids"] = dict(sorted(uuids.items()))
    return out


def _resolve_portable(path: str) -> str | None:
    """The file a :func:`portable_path` names in this process: the first
    ``sys.path`` entry holding it (as an import would find it)."""
    if os.path.isabs(path):
        return path if os.path.isfile(path) else None
    for entry in sys.path:
        candidate = os.path.join(os.path.abspath(entry or os.curdir), path)
        if os.path.isfile(candidate):
            return candidate
    return None


def _loaded_files(portable: set[str]) -> dict[str, str]:
    """``{portable path: file}`` of the imported modules among ``portable``:
    the file a module was really imported from wins over a ``sys.path``
    search (an earlier entry may hold another copy)."""
    out: dict[str, str] = {}
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not isinstance(f, str) or not any(f.endswith(p) for p in portable):
            continue
        rel = portable_path(f)
        if rel in portable:
            out.setdefault(rel, f)
    return out


def saved_key_factors(saved: Mapping[str, Any], config: CompileConfig) -> KeyFactors | None:
    """The factors saved with an ahead-of-time entry, if they still hold:
    the environment, config and Inductor factors are computed again and
    must be equal, and every file of the code factor (traced sources and op
    implementations, found again by portable path) must hash the same. The
    graph is the saved graph, and the compiler factors are part of the
    launch key the entry was found under. ``None``: compute them again."""
    try:
        kf = KeyFactors(**{g: saved[g] for g in GROUPS})
    except (KeyError, TypeError):
        return None
    files = kf.code.get("files") if isinstance(kf.code, dict) else None
    if not isinstance(files, dict):
        return None
    if (
        kf.env != env_factors()
        or kf.config != config_factors(config)
        or kf.inductor != inductor_factors(config.inductor_config)
    ):
        return None
    loaded = _loaded_files(set(files))
    paths = {p: loaded.get(p) or _resolve_portable(p) for p in files}
    if any(v is None for v in paths.values()):
        return None
    report = hash_files_report(sorted({v for v in paths.values() if v is not None}))
    now = {f.path: f.digest for f in report.files}
    if any(now.get(paths[p] or "") != digest for p, digest in files.items()):
        return None
    return kf


def make_key_factors(
    config: CompileConfig,
    compiler_hash: str,
    gm: torch.fx.GraphModule,
    example_inputs: Iterable[Any],
    traced_files: Iterable[str],
    env: Mapping[str, str] | None = None,
) -> KeyFactors:
    return KeyFactors(
        env=env_factors(env),
        config=config_factors(config),
        inductor=inductor_factors(config.inductor_config),
        graph=graph_factor(gm, example_inputs),
        code=code_factor(traced_files, gm),
        compiler=compiler_factors(compiler_hash),
    )


def piece_signature(gm: torch.fx.GraphModule) -> str:
    """The piece's graph as text with canonical names, so that two pieces
    that differ only in placeholder or node names (the layers of one model)
    have one signature. Constants (``get_attr``) enter by content."""
    names: dict[torch.fx.Node, str] = {}
    lines: list[str] = []

    def ref(a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda n: _Ref(names[n]))  # type: ignore[arg-type,return-value]

    for i, node in enumerate(gm.graph.nodes):
        names[node] = f"v{i}"
        if node.op == "get_attr":
            target: Any = node.target
            value = _attr(gm, str(node.target))
            if isinstance(value, torch.Tensor):
                target = _tensor_digest(value)
        elif node.op == "call_function":
            from fxpiece.piecewise.ops import describe_target

            target = describe_target(node.target)
        elif node.op == "placeholder":
            target = "input"
        else:
            target = node.target
        lines.append(f"{names[node]} = {node.op} {target} {ref(node.args)!r} {ref(node.kwargs)!r}")
    return "\n".join(lines)


class _Ref:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _tensor_digest(t: torch.Tensor) -> str:
    meta = f"{t.dtype}{tuple(t.shape)}{t.stride()}"
    if t.device.type == "meta":
        return f"tensor{meta}"
    data = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return f"tensor{meta}:{hash_factors(data)}"
