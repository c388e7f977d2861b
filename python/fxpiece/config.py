"""Configuration of the backend: one frozen, validated dataclass.

>>> from fxpiece import CompileConfig
>>> cfg = CompileConfig(compile_ranges_endpoints=[32, 8], max_num_tokens=256, compile_sizes=[16])
>>> [str(r) for r in cfg.compile_ranges]
['[1,8]', '[9,32]', '[33,256]']
>>> CompileConfig(max_num_tokens=0)
Traceback (most recent call last):
...
fxpiece.errors.ConfigError: max_num_tokens: must be an int in [1, 2147483647], got 0

Every field declares, in its metadata (:func:`option`), whether it enters
the cache key (:class:`Keyed`, with how it is rendered) or not
(:class:`NotKeyed`, with why), and which ``FXPIECE_*`` variable sets it
(:class:`EnvVar`, with its parser). :func:`config_factors` and
:meth:`CompileConfig.from_env` are generated from that; a field without a
classification fails at import.

>>> from fxpiece.config import env_variables
>>> env_variables()["FXPIECE_MAX_NUM_TOKENS"]
'max_num_tokens'
>>> CompileConfig.from_env({"FXPIECE_COMPILER": "tvm"})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fxpiece.errors.ConfigError: FXPIECE_COMPILER: 'tvm' is not a valid compiler: unknown ...

This module is the bottom of the configuration: it imports no module that
imports it back (the torch-facing checks and renderers it calls lazily,
``piecewise.ops``, ``piecewise.interface``, ``piecewise.passes`` and
``piecewise._torch_compat``, never import it).
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
from typing import TYPE_CHECKING, Any, TypeVar

from fxpiece.context import validate_path_part
from fxpiece.errors import ConfigError
from fxpiece.ranges import Range, compile_entries, ranges_from_endpoints

if TYPE_CHECKING:
    from fxpiece.piecewise.interface import CompilerInterface
    from fxpiece.piecewise.passes import InductorPass

__all__ = [
    "BUILTIN_COMPILERS",
    "DYNAMIC_MODES",
    "CompileConfig",
    "EnvVar",
    "FieldSpec",
    "Keyed",
    "NotKeyed",
    "config_factors",
    "default_cache_root",
    "env_variables",
    "factor_value",
    "field_specs",
    "option",
]

MAX_TOKENS = 2**31 - 1
"""Largest token count (sizes are int32 in Inductor's generated code)."""

BUILTIN_COMPILERS = ("inductor", "inductor-fx-cache", "eager")

DYNAMIC_MODES = ("auto", "backed", "unbacked")
"""Values of ``dynamic`` (torch-free here; ``_torch_compat`` resolves them)."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})

_SPEC = "fxpiece"
"""The key of a field's :class:`FieldSpec` in its ``metadata``."""

T = TypeVar("T")


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


# -- field metadata --------------------------------------------------------------


@dataclass(frozen=True)
class Keyed:
    """The field enters the cache key as the factor ``factor`` (default: the
    field's name), rendered by ``render(config)`` (default: the value as it
    is). Fields that together make one factor (the ranges and sizes make
    ``compile_entries``) name the same factor and the same renderer; it is
    rendered once, where its first field stands."""

    factor: str | None = None
    render: Callable[[CompileConfig], Any] | None = None


@dataclass(frozen=True)
class NotKeyed:
    """The field never enters the cache key: ``why`` it cannot change what
    a compile produces."""

    why: str


@dataclass(frozen=True)
class EnvVar:
    """The environment variable that sets a field in
    :meth:`CompileConfig.from_env`, and its parser ``parse(name, raw)``,
    which raises :class:`ConfigError` naming the variable. An empty value
    leaves the field at its default when ``empty_unsets``; otherwise it is
    parsed (an empty flag is false, an empty list is empty)."""

    name: str
    parse: Callable[[str, str], Any]
    empty_unsets: bool = True


@dataclass(frozen=True)
class FieldSpec:
    """What a :class:`CompileConfig` field declares about itself."""

    key: Keyed | NotKeyed
    env: EnvVar | None = None


def option(default: T, *, key: Keyed | NotKeyed, env: EnvVar | None = None) -> T:
    """A :class:`CompileConfig` field with its :class:`FieldSpec`."""
    return field(default=default, metadata={_SPEC: FieldSpec(key=key, env=env)})


def option_factory(
    factory: Callable[[], T],
    *,
    key: Keyed | NotKeyed,
    env: EnvVar | None = None,
    hash: bool | None = None,
) -> T:
    """:func:`option` with a default made by ``factory`` for each config."""
    return field(default_factory=factory, hash=hash, metadata={_SPEC: FieldSpec(key=key, env=env)})


# -- environment parsers (each raises ConfigError naming the variable) -----------


def _parse_flag(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(
        name, f"{raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off, or unset {name}"
    )


def _parse_text(name: str, raw: str) -> str:
    return raw


def _parse_word(name: str, raw: str) -> str:
    return raw.strip().lower()


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(
            name, f"{raw!r} is not an int; set a whole number or unset {name}"
        ) from None


def _parse_ints(name: str, raw: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in raw.replace(" ", "").split(",") if x)
    except ValueError:
        raise ConfigError(
            name, f"{raw!r} is not a comma-separated list of ints (such as '8,32'); fix or unset it"
        ) from None


def _parse_names(name: str, raw: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in raw.split(",") if s.strip())


def _flag_var(name: str) -> EnvVar:
    return EnvVar(name, _parse_flag, empty_unsets=False)


# -- cache key renderers -----------------------------------------------------------


def factor_value(name: str, v: Any) -> Any:
    """A config value as a key factor: JSON-like values as they are, objects
    with a ``uuid()`` (Inductor's custom passes) by it; a callable without
    one cannot be keyed and raises :class:`~fxpiece.ConfigError`."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [factor_value(name, x) for x in v]
    if isinstance(v, dict):
        return {str(k): factor_value(name, x) for k, x in v.items()}
    uuid = getattr(v, "uuid", None)
    if callable(uuid):
        return {"uuid": str(uuid())}
    if callable(v):
        raise ConfigError(
            "inductor_config",
            f"{name} is set to {v!r}, which has no uuid(): the cache cannot tell when it "
            "changes. Make it a torch._inductor.custom_graph_pass.CustomGraphPass with a "
            "uuid() (or an fxpiece.InductorPass in post_grad_passes), or disable the cache",
        )
    return f"{type(v).__module__}.{type(v).__qualname__}:{v}"


def _render_splitting_ops(c: CompileConfig) -> list[str]:
    from fxpiece.piecewise.ops import resolve_splitting_ops

    return sorted(resolve_splitting_ops(c.splitting_ops).labels)


def _render_entries(c: CompileConfig) -> list[list[int]]:
    return [[r.start, r.end] for r in c.compile_entries]


def _render_compiler(c: CompileConfig) -> str:
    return c.compiler_name


def _render_inductor_config(c: CompileConfig) -> dict[str, Any]:
    return {k: factor_value(k, v) for k, v in sorted(c.inductor_config.items())}


def _render_passes(c: CompileConfig) -> list[str]:
    return [p.uuid() for p in c.post_grad_passes]


def _render_dynamic(c: CompileConfig) -> str:
    # Backed and unbacked token dims trace different graphs; "auto" is keyed
    # as what it means on the installed torch.
    from fxpiece.piecewise import _torch_compat

    return _torch_compat.resolve_dynamic(c.dynamic)


_ENTRIES = Keyed("compile_entries", _render_entries)
_COORDINATION = "coordinates processes (waiting, leases, slots), never what a compile produces"
_ACCESS = "decides how the cache is used, never what a compile produces"


@dataclass(frozen=True, kw_only=True)
class CompileConfig:
    """Everything that decides how the backend splits, compiles and caches.

    Validated on construction: a bad field raises :class:`ConfigError` naming
    the field and the fix. Lists are stored as sorted, deduplicated tuples.
    Each field's metadata (:class:`FieldSpec`) says whether it enters the
    cache key and which environment variable sets it.
    """

    splitting_ops: Sequence[str | Callable[..., Any]] = option(
        (),
        key=Keyed(render=_render_splitting_ops),
        env=EnvVar("FXPIECE_SPLITTING_OPS", _parse_names, empty_unsets=False),
    )
    """Ops to split at: ``"ns::op"``, ``"ns::op.overload"``, callables or
    their dotted names (``"torch.nn.functional.scaled_dot_product_attention"``)."""
    compile_ranges_endpoints: Sequence[int] = option(
        (),
        key=_ENTRIES,
        env=EnvVar("FXPIECE_COMPILE_RANGES_ENDPOINTS", _parse_ints, empty_unsets=False),
    )
    """Range ends below ``max_num_tokens``; ``[8, 32]`` gives ``[1,8] [9,32] [33,max]``."""
    max_num_tokens: int = option(
        8192, key=_ENTRIES, env=EnvVar("FXPIECE_MAX_NUM_TOKENS", _parse_int)
    )
    """End of the last range."""
    compile_sizes: Sequence[int] = option(
        (),
        key=_ENTRIES,
        env=EnvVar("FXPIECE_COMPILE_SIZES", _parse_ints, empty_unsets=False),
    )
    """Exact sizes compiled with concrete shapes; they win over ranges."""
    compiler: str | CompilerInterface = option(
        "inductor",
        key=Keyed(render=_render_compiler),
        env=EnvVar("FXPIECE_COMPILER", _parse_text),
    )
    """``"inductor"`` (standalone artifacts), ``"inductor-fx-cache"``,
    ``"eager"``, or a :class:`CompilerInterface`."""
    cache_dir: str | None = option(
        None,
        key=NotKeyed("where the cache is, not what it holds (keys hold no paths)"),
        env=EnvVar("FXPIECE_CACHE_ROOT", _parse_text),
    )
    """Cache root; ``None`` means ``~/.cache/fxpiece`` (see :meth:`from_env`)."""
    disable_cache: bool = option(
        False, key=NotKeyed(_ACCESS), env=_flag_var("FXPIECE_DISABLE_CACHE")
    )
    """Switch every cache read and write off."""
    inductor_config: Mapping[str, Any] = option_factory(
        dict, key=Keyed(render=_render_inductor_config), hash=False
    )
    """Inductor options (``torch._inductor.config`` names) used for every piece."""
    post_grad_passes: Sequence[InductorPass] = option((), key=Keyed(render=_render_passes))
    model_tag: str = option(
        "backbone",
        key=NotKeyed("names the cache sub-folder the keys are stored in"),
        env=EnvVar("FXPIECE_MODEL_TAG", _parse_text),
    )
    """Cache sub-folder; :func:`fxpiece.set_model_tag` overrides it."""
    use_inductor_graph_partition: bool = option(False, key=Keyed())
    """No FX pre-split: Inductor partitions at the splitting ops (if supported)."""
    strict: bool = option(
        False,
        key=NotKeyed("decides at run time what a size no entry serves does"),
        env=_flag_var("FXPIECE_STRICT"),
    )
    """A token count outside every range raises instead of running uncompiled."""
    cache_readonly: bool = option(
        False, key=NotKeyed(_ACCESS), env=_flag_var("FXPIECE_CACHE_READONLY")
    )
    """Load hits, compile misses in memory, never write (works on a
    read-only mount)."""
    require_cache_hit: bool = option(
        False, key=NotKeyed(_ACCESS), env=_flag_var("FXPIECE_REQUIRE_CACHE_HIT")
    )
    """Deployments that must never compile: a miss raises
    :class:`~fxpiece.CacheMissError` naming the factors that differ from the
    nearest cached key."""
    allow_untrusted_cache: bool = option(
        False, key=NotKeyed(_ACCESS), env=_flag_var("FXPIECE_ALLOW_UNTRUSTED_CACHE")
    )
    """Load from a cache folder that other users can write (they could make
    us run their code); refused by default."""
    lock_timeout: float = option(900.0, key=NotKeyed(_COORDINATION))
    """Seconds to wait for another process compiling the same piece before
    compiling it here too."""
    lease_ttl: float = option(30.0, key=NotKeyed(_COORDINATION))
    """A compile lease not renewed for this long (its holder's host is gone)
    may be taken over; a dead holder on this host is taken over at once."""
    max_parallel_compiles: int | None = option(
        None,
        key=NotKeyed(_COORDINATION),
        env=EnvVar("FXPIECE_MAX_PARALLEL_COMPILES", _parse_int),
    )
    """Compiles that may run at once on one host, across every process of
    the job (a per-host counting semaphore of slot files, see
    :mod:`fxpiece.cache.slots`); ``None``: the cores this process may use
    divided by Inductor's compile threads, at least 1. Not part of the key."""
    remote_cache: str | None = option(
        None,
        key=NotKeyed("where a second tier of the cache is, not what it holds"),
        env=EnvVar("FXPIECE_REMOTE_CACHE", _parse_text),
    )
    """A remote cache tier shared by hosts (``redis://host:6379/0``,
    ``rediss://``, ``unix:///path?db=0``; needs ``fxpiece[remote]``): pieces,
    kernel bundles and ahead-of-time entries are pulled on a local miss and
    pushed once built, signed, and compiled once per fleet (a lease on the
    server); see :mod:`fxpiece.piecewise.remote_tier`. ``None``: local only."""
    static_graph_wrapper: Callable[..., Any] | None = option(
        None, key=NotKeyed("wraps a loaded piece at run time; what is stored is unwrapped")
    )
    """Per-piece wrapper factory ``wrapper(fn, piece_index, entry) -> callable``
    (CUDA graphs on GPU); see :mod:`fxpiece.wrappers`."""
    dynamic: str = option(
        "auto",
        key=Keyed(render=_render_dynamic),
        env=EnvVar("FXPIECE_DYNAMIC", _parse_word),
    )
    """How :func:`fxpiece.compile` makes token dims dynamic: ``"unbacked"``
    (``mark_unbacked``: no hint, never specialised), ``"backed"``
    (``mark_dynamic`` traced with ``backed_size_oblivious``, so 0 and 1 are
    not specialised either), or ``"auto"`` (what works on the installed
    torch: ``"unbacked"`` on 2.9 to 2.15). Either way one graph serves every
    token count, 0 and 1 included."""
    aot: bool = option(
        True,
        key=NotKeyed(
            "decides whether Dynamo's output is saved too; those entries have their own key"
        ),
        env=_flag_var("FXPIECE_AOT"),
    )
    """:func:`fxpiece.compile` only: on a cold start, also save what Dynamo
    produced (bytecode, guards, the graph) when the model traces as one
    graph, and on a warm start load it instead of tracing again (where
    torch supports it; see :mod:`fxpiece.piecewise.aot_start`)."""

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        put("splitting_ops", _splitting_ops(self.splitting_ops))
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
        _check_compiler(self.compiler)
        if self.cache_dir is not None:
            put("cache_dir", _cache_dir(self.cache_dir))
        put("inductor_config", _inductor_config(self.inductor_config))
        put("post_grad_passes", _post_grad_passes(self.post_grad_passes))
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
        if self.remote_cache is not None:
            from fxpiece.remote.redis_store import check_url

            check_url(self.remote_cache)
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
        """Build a config from the ``FXPIECE_*`` variables (the only place the
        environment is read; :func:`env_variables` lists them with the field
        each sets), then apply ``overrides``.

        A value that does not parse, or that its field rejects, raises
        :class:`ConfigError` naming the variable (``field`` is its name) and
        the fix; an override's error names the field as the constructor does.
        """
        e = os.environ if env is None else env
        kw: dict[str, Any] = {}
        source: dict[str, str] = {}
        for name, spec in _SPECS:
            var = spec.env
            if var is None or var.name not in e or (var.empty_unsets and e[var.name] == ""):
                continue
            kw[name] = var.parse(var.name, e[var.name])
            source[name] = var.name
        for name in overrides:
            source.pop(name, None)
        kw.update(overrides)
        try:
            return cls(**kw)
        except ConfigError as err:
            var_name = source.get(err.field)
            if var_name is None:
                raise
            reason = str(err).removeprefix(f"{err.field}: ")
            raise ConfigError(
                var_name,
                f"{e[var_name]!r} is not a valid {err.field}: {reason}; fix or unset {var_name}",
            ) from err


def field_specs(cls: type[Any]) -> tuple[tuple[str, FieldSpec], ...]:
    """Each field of dataclass ``cls`` with its :class:`FieldSpec`, in
    order. Raises ``TypeError`` naming a field that is not classified (no
    spec: neither :class:`Keyed` nor :class:`NotKeyed`), a factor two fields
    render differently, or a variable two fields claim."""
    out: list[tuple[str, FieldSpec]] = []
    renders: dict[str, Callable[[CompileConfig], Any] | None] = {}
    claimed: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_SPEC)
        if not isinstance(spec, FieldSpec) or not isinstance(spec.key, Keyed | NotKeyed):
            raise TypeError(
                f"{cls.__name__}.{f.name} is not classified for the cache key: declare it "
                "with fxpiece.config.option(default, key=Keyed(...)) if it can change what a "
                "compile produces, or key=NotKeyed('why not') if it cannot"
            )
        if isinstance(spec.key, Keyed):
            factor = spec.key.factor or f.name
            if renders.setdefault(factor, spec.key.render) is not spec.key.render:
                raise TypeError(
                    f"{cls.__name__}.{f.name}: factor {factor!r} is rendered differently by "
                    "another field; fields that make one factor share one Keyed(...)"
                )
        if spec.env is not None:
            other = claimed.setdefault(spec.env.name, f.name)
            if other != f.name:
                raise TypeError(f"{cls.__name__}.{f.name}: {spec.env.name} already sets {other}")
        out.append((f.name, spec))
    return tuple(out)


_SPECS = field_specs(CompileConfig)
"""Every field's spec, checked once at import: an unclassified field fails here."""


def config_factors(config: CompileConfig) -> dict[str, Any]:
    """The config's part of the cache key: every :class:`Keyed` field,
    rendered, in field order (fields making one factor render it once)."""
    out: dict[str, Any] = {}
    for name, spec in _SPECS:
        key = spec.key
        if isinstance(key, Keyed):
            factor = key.factor or name
            if factor not in out:
                out[factor] = key.render(config) if key.render else getattr(config, name)
    return out


def env_variables() -> dict[str, str]:
    """Each ``FXPIECE_*`` variable :meth:`CompileConfig.from_env` reads, with
    the field it sets."""
    return {spec.env.name: name for name, spec in _SPECS if spec.env is not None}


def _is_compiler(c: Any) -> bool:
    from fxpiece.piecewise.interface import CompilerInterface

    return isinstance(c, CompilerInterface)


def _is_pass(p: Any) -> bool:
    from fxpiece.piecewise.passes import InductorPass

    return isinstance(p, InductorPass)


def _inductor_option_names() -> frozenset[str]:
    from fxpiece.piecewise import _torch_compat

    return _torch_compat.inductor_option_names()


def _splitting_ops(ops: Any) -> tuple[Any, ...]:
    if isinstance(ops, str) or callable(ops):
        ops = (ops,)
    if not hasattr(ops, "__iter__"):
        raise ConfigError("splitting_ops", f"must be a list of op names or callables, got {ops!r}")
    out = tuple(ops)
    for op in out:
        if not isinstance(op, str) and not callable(op):
            raise ConfigError(
                "splitting_ops", f"{op!r} is neither an op name ('ns::op') nor a callable"
            )
    return out


def _check_compiler(c: Any) -> None:
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


def _cache_dir(value: Any) -> str:
    if not isinstance(value, str | os.PathLike):
        raise ConfigError("cache_dir", f"must be a path, got {value!r}")
    path = os.fspath(value)
    if not isinstance(path, str):
        raise ConfigError("cache_dir", f"must be a str path, got {path!r}")
    _check_path("cache_dir", path)
    return path


def _inductor_config(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError("inductor_config", "must be a dict of torch._inductor.config names")
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise ConfigError("inductor_config", f"keys must be str, got {bad!r}")
    badv = [k for k, v in value.items() if not _json_like(v)]
    if badv:
        raise ConfigError(
            "inductor_config",
            f"values of {badv} are not JSON-like (None, bool, int, finite float, str, "
            "lists and dicts of those) nor a custom pass with a uuid()",
        )
    known = _inductor_option_names() if value else frozenset()
    unknown = [k for k in value if k not in known]
    if unknown:
        near = {k: difflib.get_close_matches(k, list(known), n=3) for k in unknown}
        hints = "; ".join(
            f"{k!r}" + (f" (did you mean {', '.join(map(repr, m))}?)" if m else "")
            for k, m in near.items()
        )
        raise ConfigError("inductor_config", f"unknown torch._inductor.config option(s): {hints}")
    return MappingProxyType(dict(value))


def _post_grad_passes(value: Any) -> tuple[Any, ...]:
    passes = tuple(value)
    for p in passes:
        if not _is_pass(p):
            raise ConfigError(
                "post_grad_passes", f"{p!r} is not an instance of fxpiece.InductorPass"
            )
    return passes
