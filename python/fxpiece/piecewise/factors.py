"""The factors of the cache key, gathered from torch, the config and the
environment: everything that can change what a compile produces. The key
formula itself lives in :mod:`fxpiece.cache.keys`.

Six groups of factors (:class:`~fxpiece.cache.keys.KeyFactors`):

- ``env``: an explicit allow-list of environment variables that change
  generated code (never ports, ranks, HOME, paths or other per-process values);
- ``config``: every :class:`~fxpiece.CompileConfig` field that changes compiled
  code (no paths), the resolved Inductor options (minus paths and logging),
  and the Dynamo graph itself (its code and input metadata);
- ``code``: every source file Dynamo traced for the graph (``hash_files``);
- ``compiler``: torch version and build, Python, machine, CPU vector ISA, the
  C++ compiler, and the compiler adaptor's own hash.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch

import fxpiece
from fxpiece.cache.keys import KeyFactors
from fxpiece.config import CompileConfig
from fxpiece.hashing import hash_factors, hash_files_report
from fxpiece.piecewise import _torch_compat

__all__ = [
    "compiler_factors",
    "config_factors",
    "env_factors",
    "graph_factor",
    "input_meta",
    "make_key_factors",
    "piece_signature",
]

ENV_ALLOW_NAMES = ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "TORCH_BF16_REDUCED_PRECISION")
"""Variables outside ``TORCHINDUCTOR_*`` that change generated code."""
_ENV_PREFIX = "TORCHINDUCTOR_"
_ENV_DENY = re.compile(r"(DIR|PATH|CACHE|THREADS|DEBUG|TRACE|LOG|PORT|RANK|WORKER|PROFILE)")
_INDUCTOR_DENY = re.compile(
    r"(dir|path|log|cache|debug|trace|profil|compile_threads|worker)", re.IGNORECASE
)


def env_factors(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed environment variables that are set."""
    e = os.environ if env is None else env
    out = {k: e[k] for k in ENV_ALLOW_NAMES if k in e}
    for k, v in e.items():
        if k.startswith(_ENV_PREFIX) and not _ENV_DENY.search(k[len(_ENV_PREFIX) :]):
            out[k] = v
    return dict(sorted(out.items()))


def inductor_factors(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The portable Inductor config with ``overrides`` applied, minus paths,
    logging and cache switches (which do not change generated code)."""
    cfg = _torch_compat.inductor_config_portable()
    cfg.update(overrides)
    return {k: _jsonable(v) for k, v in sorted(cfg.items()) if not _INDUCTOR_DENY.search(k)}


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return f"<{type(v).__module__}.{type(v).__qualname__}>"


def config_factors(config: CompileConfig) -> dict[str, Any]:
    """Fields of ``config`` that change compiled code; no paths."""
    from fxpiece.piecewise.ops import resolve_splitting_ops

    return {
        "splitting_ops": sorted(resolve_splitting_ops(config.splitting_ops).labels),
        "compile_entries": [[r.start, r.end] for r in config.compile_entries],
        "compiler": config.compiler_name,
        "inductor_config": {k: _jsonable(v) for k, v in sorted(config.inductor_config.items())},
        "post_grad_passes": [p.uuid() for p in config.post_grad_passes],
        "use_inductor_graph_partition": config.use_inductor_graph_partition,
    }


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


def make_key_factors(
    config: CompileConfig,
    compiler_hash: str,
    gm: torch.fx.GraphModule,
    example_inputs: Iterable[Any],
    traced_files: Iterable[str],
    env: Mapping[str, str] | None = None,
) -> KeyFactors:
    report = hash_files_report(traced_files)
    return KeyFactors(
        env=env_factors(env),
        config=config_factors(config),
        inductor=inductor_factors(config.inductor_config),
        graph=graph_factor(gm, example_inputs),
        code={
            "digest": report.digest,
            "files": {f.path: f.digest for f in report.files},
        },
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
