"""Configuration of the backend: one frozen, validated dataclass.

>>> from fxpiece import CompileConfig
>>> cfg = CompileConfig(compile_ranges_endpoints=[32, 8], max_num_tokens=256, compile_sizes=[16])
>>> [str(r) for r in cfg.compile_ranges]
['[1,8]', '[9,32]', '[33,256]']
>>> CompileConfig(max_num_tokens=0)
Traceback (most recent call last):
...
fxpiece.errors.ConfigError: max_num_tokens: must be an int in [1, 2147483647], got 0
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from fxpiece.context import validate_path_part
from fxpiece.errors import ConfigError
from fxpiece.ranges import Range, compile_entries, ranges_from_endpoints

if TYPE_CHECKING:
    from fxpiece.piecewise.interface import CompilerInterface
    from fxpiece.piecewise.passes import InductorPass

__all__ = ["BUILTIN_COMPILERS", "DYNAMIC_MODES", "CompileConfig", "default_cache_root"]

MAX_TOKENS = 2**31 - 1
"""Largest token count (sizes are int32 in Inductor's generated code)."""

BUILTIN_COMPILERS = ("inductor", "inductor-fx-cache", "eager")

DYNAMIC_MODES = ("auto", "backed", "unbacked")
"""Values of ``dynamic`` (torch-free here; ``_torch_compat`` resolves them)."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def default_cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``FXPIECE_CACHE_ROOT`` if set, else ``~/.cache/fxpiece`` (torch-free,
    for the ``fxpiece cache`` commands)."""
    e = os.environ if env is None else env
    raw = e.get("FXPIECE_CACHE_ROOT")
    if raw:
        _check_path("FXPIECE_CACHE_ROOT", raw)
        return Path(raw).expanduser()
    return Path.home() / ".cache" / "fxpiece"


def _check_path(name: str, value: str) -> None:
    if not value or "\x00" in value:
        raise ConfigError(name, f"must be a non-empty path without NUL bytes, got {value!r}")


def _ints(name: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, int | str | bytes) or not hasattr(value, "__iter__"):
        raise ConfigError(name, f"must be a list of ints, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TOKENS:
            raise ConfigError(name, f"every entry must be an int in [1, {MAX_TOKENS}], got {v!r}")
        out.append(v)
    return tuple(sorted(set(out)))


def _seconds(name: str, v: Any, low: float, high: float) -> None:
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or not math.isfinite(v)
        or not low <= v <= high
    ):
        raise ConfigError(name, f"must be a finite number of seconds in [{low}, {high}], got {v!r}")


def _json_like(v: Any, depth: int = 0) -> bool:
    """JSON-like values (what Inductor options are), or objects with a
    ``uuid()`` (Inductor's custom pass hooks), nested at most 32 levels."""
    if depth > 32:
        return False
    if v is None or isinstance(v, bool | int | str):
        return True
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, list | tuple):
        return all(_json_like(x, depth + 1) for x in v)
    if isinstance(v, Mapping):
        return all(isinstance(k, str) and _json_like(x, depth + 1) for k, x in v.items())
    return callable(getattr(v, "uuid", None))


def _flag(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(name, f"{raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


@dataclass(frozen=True, kw_only=True)
class CompileConfig:
    """Everything that decides how the backend splits, compiles and caches.

    Validated on construction: a bad field raises :class:`ConfigError` naming
    the field and the fix. Lists are stored as sorted, deduplicated tuples.
    """

    splitting_ops: Sequence[str | Callable[..., Any]] = ()
    """Ops to split at: ``"ns::op"``, ``"ns::op.overload"``, callables or
    their dotted names (``"torch.nn.functional.scaled_dot_product_attention"``)."""
    compile_ranges_endpoints: Sequence[int] = ()
    """Range ends below ``max_num_tokens``; ``[8, 32]`` gives ``[1,8] [9,32] [33,max]``."""
    max_num_tokens: int = 8192
    """End of the last range."""
    compile_sizes: Sequence[int] = ()
    """Exact sizes compiled with concrete shapes; they win over ranges."""
    compiler: str | CompilerInterface = "inductor"
    """``"inductor"`` (standalone artifacts), ``"inductor-fx-cache"``,
    ``"eager"``, or a :class:`CompilerInterface`."""
    cache_dir: str | None = None
    """Cache root; ``None`` means ``~/.cache/fxpiece`` (see :meth:`from_env`)."""
    disable_cache: bool = False
    """Switch every cache read and write off."""
    inductor_config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Inductor options (``torch._inductor.config`` names) used for every piece."""
    post_grad_passes: Sequence[InductorPass] = ()
    model_tag: str = "backbone"
    """Cache sub-folder; :func:`fxpiece.set_model_tag` overrides it."""
    use_inductor_graph_partition: bool = False
    """No FX pre-split: Inductor partitions at the splitting ops (if supported)."""
    strict: bool = False
    """A token count outside every range raises instead of running uncompiled."""
    cache_readonly: bool = False
    """Load hits, compile misses in memory, never write (works on a
    read-only mount)."""
    require_cache_hit: bool = False
    """Deployments that must never compile: a miss raises
    :class:`~fxpiece.CacheMissError` naming the factors that differ from the
    nearest cached key."""
    allow_untrusted_cache: bool = False
    """Load from a cache folder that other users can write (they could make
    us run their code); refused by default."""
    lock_timeout: float = 900.0
    """Seconds to wait for another process compiling the same piece before
    compiling it here too."""
    lease_ttl: float = 30.0
    """A compile lease not renewed for this long (its holder's host is gone)
    may be taken over; a dead holder on this host is taken over at once."""
    max_parallel_compiles: int | None = None
    """Compiles that may run at once on one host, across every process of
    the job (a per-host counting semaphore of slot files, see
    :mod:`fxpiece.cache.slots`); ``None``: the cores this process may use
    divided by Inductor's compile threads, at least 1. Not part of the key."""
    static_graph_wrapper: Callable[..., Any] | None = None
    """Per-piece wrapper factory ``wrapper(fn, piece_index, entry) -> callable``
    (CUDA graphs on GPU); see :mod:`fxpiece.wrappers`."""
    dynamic: str = "auto"
    """How :func:`fxpiece.compile` makes token dims dynamic: ``"unbacked"``
    (``mark_unbacked``: no hint, never specialised), ``"backed"``
    (``mark_dynamic`` traced with ``backed_size_oblivious``, so 0 and 1 are
    not specialised either), or ``"auto"`` (what works on the installed
    torch: ``"unbacked"`` on 2.9 to 2.15). Either way one graph serves every
    token count, 0 and 1 included."""
    aot: bool = True
    """:func:`fxpiece.compile` only: on a cold start, also save what Dynamo
    produced (bytecode, guards, the graph) when the model traces as one
    graph, and on a warm start load it instead of tracing again (where
    torch supports it; see :mod:`fxpiece.piecewise.aot_start`)."""

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        ops = self.splitting_ops
        if isinstance(ops, str) or callable(ops):
            ops = (ops,)
        if not hasattr(ops, "__iter__"):
            raise ConfigError(
                "splitting_ops", f"must be a list of op names or callables, got {ops!r}"
            )
        ops = tuple(ops)
        for op in ops:
            if not isinstance(op, str) and not callable(op):
                raise ConfigError(
                    "splitting_ops", f"{op!r} is neither an op name ('ns::op') nor a callable"
                )
        put("splitting_ops", ops)
        put(
            "compile_ranges_endpoints",
            _ints("compile_ranges_endpoints", self.compile_ranges_endpoints),
        )
        put("compile_sizes", _ints("compile_sizes", self.compile_sizes))
        m = self.max_num_tokens
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_TOKENS:
            raise ConfigError("max_num_tokens", f"must be an int in [1, {MAX_TOKENS}], got {m!r}")
        too_big = [s for s in self.compile_sizes if s > m]
        if too_big:
            raise ConfigError(
                "compile_sizes",
                f"{too_big} exceed max_num_tokens={m}; raise max_num_tokens or drop them",
            )
        c = self.compiler
        if isinstance(c, str):
            if c not in BUILTIN_COMPILERS:
                raise ConfigError(
                    "compiler",
                    f"unknown compiler {c!r}; use one of {', '.join(BUILTIN_COMPILERS)} "
                    "or a fxpiece.CompilerInterface instance",
                )
        elif not _is_compiler(c):
            raise ConfigError(
                "compiler", f"{c!r} is not a compiler name nor a fxpiece.CompilerInterface"
            )
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, str | os.PathLike):
                raise ConfigError("cache_dir", f"must be a path, got {self.cache_dir!r}")
            path = os.fspath(self.cache_dir)
            if not isinstance(path, str):
                raise ConfigError("cache_dir", f"must be a str path, got {path!r}")
            _check_path("cache_dir", path)
            put("cache_dir", path)
        if not isinstance(self.inductor_config, Mapping):
            raise ConfigError("inductor_config", "must be a dict of torch._inductor.config names")
        bad = [k for k in self.inductor_config if not isinstance(k, str)]
        if bad:
            raise ConfigError("inductor_config", f"keys must be str, got {bad!r}")
        badv = [k for k, v in self.inductor_config.items() if not _json_like(v)]
        if badv:
            raise ConfigError(
                "inductor_config",
                f"values of {badv} are not JSON-like (None, bool, int, finite float, str, "
                "lists and dicts of those) nor a custom pass with a uuid()",
            )
        known = _inductor_option_names() if self.inductor_config else frozenset()
        unknown = [k for k in self.inductor_config if k not in known]
        if unknown:
            near = {k: difflib.get_close_matches(k, list(known), n=3) for k in unknown}
            hints = "; ".join(
                f"{k!r}" + (f" (did you mean {', '.join(map(repr, m))}?)" if m else "")
                for k, m in near.items()
            )
            raise ConfigError(
                "inductor_config", f"unknown torch._inductor.config option(s): {hints}"
            )
        put("inductor_config", MappingProxyType(dict(self.inductor_config)))
        passes = tuple(self.post_grad_passes)
        for p in passes:
            if not _is_pass(p):
                raise ConfigError(
                    "post_grad_passes", f"{p!r} is not an instance of fxpiece.InductorPass"
                )
        put("post_grad_passes", passes)
        validate_path_part("model_tag", self.model_tag)
        for name in (
            "disable_cache",
            "use_inductor_graph_partition",
            "strict",
            "allow_untrusted_cache",
            "require_cache_hit",
            "cache_readonly",
            "aot",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be True or False, got {getattr(self, name)!r}")
        _seconds("lock_timeout", self.lock_timeout, 0.001, 7 * 86400.0)
        _seconds("lease_ttl", self.lease_ttl, 0.5, 86400.0)
        n = self.max_parallel_compiles
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 4096):
            raise ConfigError(
                "max_parallel_compiles", f"must be None (automatic) or an int >= 1, got {n!r}"
            )
        if self.dynamic not in DYNAMIC_MODES:
            raise ConfigError(
                "dynamic", f"must be one of {', '.join(DYNAMIC_MODES)}, got {self.dynamic!r}"
            )
        if self.static_graph_wrapper is not None and not callable(self.static_graph_wrapper):
            raise ConfigError("static_graph_wrapper", "must be a callable (a class or factory)")
        # Resolve op names now so a typo fails here, not at compile time (a
        # dotted name whose module is not imported yet is resolved by the backend).
        if self.splitting_ops:
            from fxpiece.piecewise.ops import resolve_splitting_ops

            resolve_splitting_ops(self.splitting_ops, import_modules=False)

    @property
    def compile_ranges(self) -> tuple[Range, ...]:
        return ranges_from_endpoints(self.compile_ranges_endpoints, self.max_num_tokens)

    @property
    def compile_entries(self) -> tuple[Range, ...]:
        """Ranges, then exact sizes not already a range."""
        return compile_entries(self.compile_ranges, self.compile_sizes)

    @property
    def compiler_name(self) -> str:
        return self.compiler if isinstance(self.compiler, str) else self.compiler.name

    def resolved_cache_dir(self) -> Path:
        if self.cache_dir is not None:
            return Path(self.cache_dir).expanduser()
        return default_cache_root({})

    def replace(self, **changes: Any) -> CompileConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> CompileConfig:
        """Build a config from ``FXPIECE_*`` variables (the only place the
        environment is read), then apply ``overrides``.

        ``FXPIECE_CACHE_ROOT``, ``FXPIECE_DISABLE_CACHE``, ``FXPIECE_COMPILER``,
        ``FXPIECE_SPLITTING_OPS`` (comma-separated), ``FXPIECE_COMPILE_SIZES``,
        ``FXPIECE_COMPILE_RANGES_ENDPOINTS``, ``FXPIECE_MAX_NUM_TOKENS``,
        ``FXPIECE_MODEL_TAG``, ``FXPIECE_STRICT``, ``FXPIECE_REQUIRE_CACHE_HIT``,
        ``FXPIECE_CACHE_READONLY``,
        ``FXPIECE_ALLOW_UNTRUSTED_CACHE``, ``FXPIECE_DYNAMIC``, ``FXPIECE_AOT``,
        ``FXPIECE_MAX_PARALLEL_COMPILES``.
        """
        e = os.environ if env is None else env
        kw: dict[str, Any] = {}

        def ints(var: str) -> tuple[int, ...]:
            raw = e[var]
            try:
                return tuple(int(x) for x in raw.replace(" ", "").split(",") if x)
            except ValueError:
                raise ConfigError(var, f"{raw!r} is not a comma-separated list of ints") from None

        if e.get("FXPIECE_CACHE_ROOT"):
            kw["cache_dir"] = e["FXPIECE_CACHE_ROOT"]
        if "FXPIECE_DISABLE_CACHE" in e:
            kw["disable_cache"] = _flag("FXPIECE_DISABLE_CACHE", e["FXPIECE_DISABLE_CACHE"])
        if "FXPIECE_ALLOW_UNTRUSTED_CACHE" in e:
            kw["allow_untrusted_cache"] = _flag(
                "FXPIECE_ALLOW_UNTRUSTED_CACHE", e["FXPIECE_ALLOW_UNTRUSTED_CACHE"]
            )
        if "FXPIECE_CACHE_READONLY" in e:
            kw["cache_readonly"] = _flag("FXPIECE_CACHE_READONLY", e["FXPIECE_CACHE_READONLY"])
        if "FXPIECE_REQUIRE_CACHE_HIT" in e:
            kw["require_cache_hit"] = _flag(
                "FXPIECE_REQUIRE_CACHE_HIT", e["FXPIECE_REQUIRE_CACHE_HIT"]
            )
        if "FXPIECE_AOT" in e:
            kw["aot"] = _flag("FXPIECE_AOT", e["FXPIECE_AOT"])
        if e.get("FXPIECE_MAX_PARALLEL_COMPILES"):
            raw = e["FXPIECE_MAX_PARALLEL_COMPILES"].strip()
            try:
                kw["max_parallel_compiles"] = int(raw)
            except ValueError:
                raise ConfigError(
                    "FXPIECE_MAX_PARALLEL_COMPILES", f"{raw!r} is not an int (compiles per host)"
                ) from None
        if "FXPIECE_STRICT" in e:
            kw["strict"] = _flag("FXPIECE_STRICT", e["FXPIECE_STRICT"])
        if e.get("FXPIECE_COMPILER"):
            kw["compiler"] = e["FXPIECE_COMPILER"]
        if e.get("FXPIECE_DYNAMIC"):
            kw["dynamic"] = e["FXPIECE_DYNAMIC"].strip().lower()
        if e.get("FXPIECE_MODEL_TAG"):
            kw["model_tag"] = e["FXPIECE_MODEL_TAG"]
        if "FXPIECE_SPLITTING_OPS" in e:
            kw["splitting_ops"] = tuple(
                s.strip() for s in e["FXPIECE_SPLITTING_OPS"].split(",") if s.strip()
            )
        if "FXPIECE_COMPILE_SIZES" in e:
            kw["compile_sizes"] = ints("FXPIECE_COMPILE_SIZES")
        if "FXPIECE_COMPILE_RANGES_ENDPOINTS" in e:
            kw["compile_ranges_endpoints"] = ints("FXPIECE_COMPILE_RANGES_ENDPOINTS")
        if e.get("FXPIECE_MAX_NUM_TOKENS"):
            raw = e["FXPIECE_MAX_NUM_TOKENS"]
            try:
                kw["max_num_tokens"] = int(raw)
            except ValueError:
                raise ConfigError("FXPIECE_MAX_NUM_TOKENS", f"{raw!r} is not an int") from None
        kw.update(overrides)
        return cls(**kw)


def _is_compiler(c: Any) -> bool:
    from fxpiece.piecewise.interface import CompilerInterface

    return isinstance(c, CompilerInterface)


def _is_pass(p: Any) -> bool:
    from fxpiece.piecewise.passes import InductorPass

    return isinstance(p, InductorPass)


def _inductor_option_names() -> frozenset[str]:
    from fxpiece.piecewise import _torch_compat

    return _torch_compat.inductor_option_names()
