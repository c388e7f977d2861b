"""CompileConfig validation and from_env, Range semantics, model tags, counters."""

from __future__ import annotations

import ast
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import fxpiece
from fxpiece import CompileConfig, ConfigError, Counters, Range
from fxpiece.config import (
    DYNAMIC_MODES,
    EnvVar,
    Keyed,
    NotKeyed,
    config_factors,
    env_variables,
    field_specs,
    option,
)
from fxpiece.context import current_model_tag, set_model_tag
from fxpiece.ranges import choose_entry, compile_entries, ranges_from_endpoints
from fxpiece.toy_llama import ATTENTION_OP

SDPA = "torch.nn.functional.scaled_dot_product_attention"

# Cheap and torch-version sensitive (config, env, Range semantics): run by
# `make test-compat` on the oldest supported torch too.
pytestmark = pytest.mark.compat


class NopPass(fxpiece.InductorPass):
    def __call__(self, graph: torch.fx.Graph) -> None:
        pass


# -- validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("splitting_ops", ["aten::no_such_op_xyz"]),
        ("splitting_ops", ["torch.nn.functional.no_such_fn"]),
        ("splitting_ops", [42]),
        ("compile_ranges_endpoints", [0]),
        ("compile_ranges_endpoints", [-8]),
        ("compile_ranges_endpoints", ["8"]),
        ("compile_ranges_endpoints", [8.0]),
        ("compile_ranges_endpoints", [True]),
        ("compile_ranges_endpoints", 8),
        ("compile_ranges_endpoints", "8,32"),
        ("compile_sizes", [0]),
        ("compile_sizes", [16, None]),
        ("compile_sizes", 16),
        ("compile_sizes", [9000]),  # above max_num_tokens (8192)
        ("max_num_tokens", 0),
        ("max_num_tokens", -1),
        ("max_num_tokens", "8192"),
        ("max_num_tokens", 8192.0),
        ("max_num_tokens", True),
        ("compiler", "tvm"),
        ("compiler", "Inductor"),
        ("compiler", 42),
        ("compiler", object()),
        ("cache_dir", ""),
        ("cache_dir", 42),
        ("inductor_config", [("max_autotune", True)]),
        ("inductor_config", {1: True}),
        ("post_grad_passes", [lambda g: None]),
        ("post_grad_passes", [NopPass]),  # the class, not an instance
        ("model_tag", "../x"),
        ("model_tag", "a/b"),
        ("model_tag", ".hidden"),
        ("model_tag", ""),
        ("model_tag", ".."),
        ("model_tag", "x" * 200),
        ("disable_cache", "yes"),
        ("disable_cache", 1),
        ("use_inductor_graph_partition", None),
        ("strict", "true"),
        ("static_graph_wrapper", 42),
        ("dynamic", "static"),
        ("dynamic", "Backed"),
        ("dynamic", ""),
        ("dynamic", None),
        ("dynamic", True),
    ],
)
def test_bad_field_raises_config_error_naming_it(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as ei:
        CompileConfig(**{field: value})
    assert isinstance(ei.value, ValueError)
    assert ei.value.field == field
    assert str(ei.value).startswith(f"{field}: ")
    assert len(str(ei.value)) > len(field) + 10  # says what is wrong / how to fix it


def test_compile_sizes_above_max_message_names_the_fix() -> None:
    with pytest.raises(ConfigError, match="max_num_tokens") as ei:
        CompileConfig(compile_sizes=[16, 64], max_num_tokens=32)
    assert ei.value.field == "compile_sizes"
    assert "[64]" in str(ei.value)
    assert CompileConfig(compile_sizes=[32], max_num_tokens=32).compile_sizes == (32,)


def test_unknown_inductor_option_is_rejected() -> None:
    assert not hasattr(torch._inductor.config, "max_autotun")
    with pytest.raises(ConfigError) as ei:
        CompileConfig(inductor_config={"max_autotun": True})
    assert ei.value.field == "inductor_config"
    assert "max_autotune" in str(ei.value), "close matches are listed"


def test_good_values_are_accepted() -> None:
    cfg = CompileConfig(
        splitting_ops=[ATTENTION_OP, "aten::mm.default", SDPA, torch.sin],
        compile_ranges_endpoints=[8],
        compile_sizes=[4],
        max_num_tokens=64,
        compiler="eager",
        cache_dir=Path("/tmp/somewhere"),
        disable_cache=True,
        inductor_config={"max_autotune": False},
        post_grad_passes=[NopPass()],
        model_tag="enc-1.v2+x_y",
        strict=True,
        static_graph_wrapper=lambda fn, i, e: fn,
    )
    assert cfg.cache_dir == "/tmp/somewhere"
    assert cfg.resolved_cache_dir() == Path("/tmp/somewhere")
    assert cfg.compiler_name == "eager"
    for name in ("inductor", "inductor-fx-cache", "eager"):
        assert CompileConfig(compiler=name).compiler_name == name
    for mode in ("auto", "backed", "unbacked"):
        assert CompileConfig(dynamic=mode).dynamic == mode


def test_frozen_and_keyword_only() -> None:
    cfg = CompileConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_num_tokens = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        CompileConfig(("aten::mm",))  # type: ignore[misc]
    opts = {"max_autotune": False}
    cfg = CompileConfig(inductor_config=opts)
    opts["max_autotune"] = True  # the caller's dict is copied
    assert cfg.inductor_config["max_autotune"] is False
    with pytest.raises(TypeError):
        cfg.inductor_config["max_autotune"] = True  # type: ignore[index]


def test_replace_revalidates() -> None:
    cfg = CompileConfig(max_num_tokens=64)
    assert cfg.replace(max_num_tokens=128).max_num_tokens == 128
    assert cfg.max_num_tokens == 64
    with pytest.raises(ConfigError) as ei:
        cfg.replace(max_num_tokens=0)
    assert ei.value.field == "max_num_tokens"


def test_lists_become_sorted_deduplicated_tuples() -> None:
    p = NopPass()
    cfg = CompileConfig(
        compile_ranges_endpoints=[32, 8, 32, 16],
        compile_sizes=[64, 16, 16, 1],
        max_num_tokens=128,
        splitting_ops=[ATTENTION_OP],
        post_grad_passes=[p],
    )
    assert cfg.compile_ranges_endpoints == (8, 16, 32)
    assert cfg.compile_sizes == (1, 16, 64)
    assert cfg.splitting_ops == (ATTENTION_OP,)
    assert cfg.post_grad_passes == (p,)
    for name in ("compile_ranges_endpoints", "compile_sizes", "splitting_ops", "post_grad_passes"):
        assert type(getattr(cfg, name)) is tuple, name
    one = CompileConfig(splitting_ops=ATTENTION_OP)  # a lone string is one op
    assert one.splitting_ops == (ATTENTION_OP,)
    gen = CompileConfig(compile_sizes=(s for s in [8, 4, 8]))
    assert gen.compile_sizes == (4, 8)


def test_defaults() -> None:
    cfg = CompileConfig()
    assert cfg.compiler == "inductor"
    assert cfg.model_tag == "backbone"
    assert cfg.max_num_tokens == 8192
    assert cfg.splitting_ops == ()
    assert cfg.cache_dir is None
    assert cfg.resolved_cache_dir() == Path.home() / ".cache" / "fxpiece"
    assert not cfg.disable_cache and not cfg.strict and not cfg.use_inductor_graph_partition
    assert cfg.compile_ranges == (Range(1, 8192),)
    assert cfg.dynamic == "auto"


# -- ranges --------------------------------------------------------------------


def test_ranges_from_endpoints() -> None:
    want = (Range(1, 8), Range(9, 32), Range(33, 8192))
    cfg = CompileConfig(compile_ranges_endpoints=[32, 8], max_num_tokens=8192)
    assert cfg.compile_ranges == want
    assert ranges_from_endpoints([8, 32], 8192) == want
    assert ranges_from_endpoints([8, 32, 8192, 9000], 8192) == want  # ends >= max dropped
    assert ranges_from_endpoints([], 100) == (Range(1, 100),)
    assert ranges_from_endpoints([1], 4) == (Range(1, 1), Range(2, 4))
    assert [str(r) for r in want] == ["[1,8]", "[9,32]", "[33,8192]"]


def test_range_semantics() -> None:
    r = Range(9, 32)
    assert 9 in r and 32 in r and 20 in r
    assert 8 not in r and 33 not in r
    assert "10" not in r
    assert not r.is_single_size
    s = Range(16, 16)
    assert s.is_single_size and 16 in s and 15 not in s and 17 not in s
    assert str(s) == "16" and repr(s) == "Range(16, 16)"
    assert Range(1, 8) < Range(9, 32)
    assert Range(3, 3) == Range(3, 3) and hash(Range(3, 3)) == hash(Range(3, 3))
    for bad in [(0, 3), (5, 4), (-1, 1), (1.0, 2), (1, "2")]:
        with pytest.raises(ConfigError) as ei:
            Range(*bad)  # type: ignore[arg-type]
        assert ei.value.field == "Range"


def test_compile_entries_ranges_then_new_sizes() -> None:
    cfg = CompileConfig(
        compile_ranges_endpoints=[8, 32], compile_sizes=[64, 16], max_num_tokens=128
    )
    assert cfg.compile_entries == (
        Range(1, 8),
        Range(9, 32),
        Range(33, 128),
        Range(16, 16),
        Range(64, 64),
    )
    # A size that already is a single-size range is not compiled twice.
    ranges = ranges_from_endpoints([1], 32)
    assert compile_entries(ranges, [1, 4]) == (Range(1, 1), Range(2, 32), Range(4, 4))


@pytest.mark.parametrize(
    ("size", "want"),
    [
        (1, Range(1, 8)),
        (8, Range(1, 8)),
        (9, Range(9, 32)),
        (16, Range(16, 16)),
        (20, Range(9, 32)),
        (64, Range(64, 64)),
        (100, Range(33, 128)),
        (128, Range(33, 128)),
        (129, None),
        (0, None),
    ],
)
def test_choose_entry_exact_size_wins(size: int, want: Range | None) -> None:
    cfg = CompileConfig(
        compile_ranges_endpoints=[8, 32], compile_sizes=[16, 64], max_num_tokens=128
    )
    assert choose_entry(cfg.compile_entries, size) == want
    # Order of entries does not matter for the exact-size rule.
    assert choose_entry(tuple(reversed(cfg.compile_entries)), size) == want


# -- from_env ------------------------------------------------------------------


def test_from_env_reads_every_variable(tmp_path: Path) -> None:
    env = {
        "FXPIECE_CACHE_ROOT": str(tmp_path / "c"),
        "FXPIECE_DISABLE_CACHE": "1",
        "FXPIECE_COMPILER": "eager",
        "FXPIECE_SPLITTING_OPS": f" {ATTENTION_OP} , {SDPA},",
        "FXPIECE_COMPILE_SIZES": "16, 4,16",
        "FXPIECE_COMPILE_RANGES_ENDPOINTS": "32,8",
        "FXPIECE_MAX_NUM_TOKENS": "128",
        "FXPIECE_MODEL_TAG": "encoder",
        "FXPIECE_STRICT": "yes",
        "FXPIECE_DYNAMIC": " Backed ",
        "UNRELATED": "x",
    }
    cfg = CompileConfig.from_env(env)
    assert cfg.cache_dir == str(tmp_path / "c")
    assert cfg.resolved_cache_dir() == tmp_path / "c"
    assert cfg.disable_cache is True
    assert cfg.compiler == "eager"
    assert cfg.splitting_ops == (ATTENTION_OP, SDPA)
    assert cfg.compile_sizes == (4, 16)
    assert cfg.compile_ranges_endpoints == (8, 32)
    assert cfg.max_num_tokens == 128
    assert cfg.model_tag == "encoder"
    assert cfg.strict is True
    assert cfg.dynamic == "backed"
    assert CompileConfig.from_env({"FXPIECE_DYNAMIC": "unbacked"}).dynamic == "unbacked"
    over = CompileConfig.from_env(env, compiler="inductor", strict=False)
    assert over.compiler == "inductor" and over.strict is False and over.max_num_tokens == 128


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        *[("1", True), ("true", True), ("ON", True), ("Yes", True)],
        *[("0", False), ("false", False), ("off", False), ("no", False), ("", False)],
    ],
)
def test_from_env_flags(raw: str, want: bool) -> None:
    cfg = CompileConfig.from_env({"FXPIECE_DISABLE_CACHE": raw, "FXPIECE_STRICT": raw})
    assert cfg.disable_cache is want and cfg.strict is want


def test_from_env_uses_the_mapping_not_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FXPIECE_COMPILER", "eager")
    monkeypatch.setenv("FXPIECE_MAX_NUM_TOKENS", "77")
    assert CompileConfig.from_env({}) == CompileConfig()
    cfg = CompileConfig.from_env()  # None: os.environ
    assert cfg.compiler == "eager" and cfg.max_num_tokens == 77


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("FXPIECE_DISABLE_CACHE", "maybe"),
        ("FXPIECE_STRICT", "2"),
        ("FXPIECE_AOT", "enabled"),
        ("FXPIECE_COMPILE_SIZES", "a,b"),
        ("FXPIECE_COMPILE_SIZES", "1.5"),
        ("FXPIECE_COMPILE_RANGES_ENDPOINTS", "8;32"),
        ("FXPIECE_MAX_NUM_TOKENS", "lots"),
        ("FXPIECE_MAX_PARALLEL_COMPILES", "many"),
    ],
)
def test_from_env_unparsable_value_names_the_variable_and_the_fix(var: str, raw: str) -> None:
    with pytest.raises(ConfigError) as ei:
        CompileConfig.from_env({var: raw})
    assert isinstance(ei.value, ValueError)
    assert ei.value.field == var
    msg = str(ei.value)
    assert msg.startswith(f"{var}: {raw!r} is not ")
    assert "unset" in msg  # the fix: a valid value, or leave the variable unset


@pytest.mark.parametrize(
    ("var", "raw", "field", "reason"),
    [
        ("FXPIECE_COMPILER", "tvm", "compiler", "use one of inductor, inductor-fx-cache, eager"),
        ("FXPIECE_MODEL_TAG", "../x", "model_tag", ""),
        ("FXPIECE_COMPILE_SIZES", "0", "compile_sizes", "every entry must be an int"),
        ("FXPIECE_MAX_NUM_TOKENS", "0", "max_num_tokens", "must be an int in [1, "),
        ("FXPIECE_MAX_PARALLEL_COMPILES", "0", "max_parallel_compiles", "an int >= 1"),
        ("FXPIECE_SPLITTING_OPS", "aten::no_such_op_xyz", "splitting_ops", "no_such_op_xyz"),
        ("FXPIECE_DYNAMIC", "static", "dynamic", "must be one of auto, backed, unbacked"),
        ("FXPIECE_CACHE_ROOT", "a\x00b", "cache_dir", "without NUL bytes"),
    ],
)
def test_from_env_value_its_field_rejects_names_the_variable(
    var: str, raw: str, field: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as ei:
        CompileConfig.from_env({var: raw})
    assert ei.value.field == var
    msg = str(ei.value)
    assert msg.startswith(f"{var}: {raw!r} is not a valid {field}: ")
    assert reason in msg  # the field's own reason, which says how to fix it
    assert msg.endswith(f"fix or unset {var}")
    cause = ei.value.__cause__
    assert isinstance(cause, ConfigError) and cause.field == field


def test_from_env_cross_field_error_names_the_variable_that_set_the_field() -> None:
    with pytest.raises(ConfigError) as ei:
        CompileConfig.from_env({"FXPIECE_COMPILE_SIZES": "16,64", "FXPIECE_MAX_NUM_TOKENS": "32"})
    assert ei.value.field == "FXPIECE_COMPILE_SIZES"
    assert "[64] exceed max_num_tokens=32" in str(ei.value)


def test_from_env_override_errors_name_the_field_and_overrides_win() -> None:
    # The bad value comes from an override, not the environment: named as
    # the constructor names it.
    with pytest.raises(ConfigError) as ei:
        CompileConfig.from_env({"FXPIECE_COMPILER": "eager"}, max_num_tokens=0)
    assert ei.value.field == "max_num_tokens"
    # An override replaces a bad variable's value before it is validated.
    cfg = CompileConfig.from_env({"FXPIECE_COMPILER": "tvm"}, compiler="eager")
    assert cfg.compiler == "eager"
    # ...but not before it is parsed: an unparsable value is an error anyway.
    with pytest.raises(ConfigError) as ei:
        CompileConfig.from_env({"FXPIECE_MAX_NUM_TOKENS": "x"}, max_num_tokens=8)
    assert ei.value.field == "FXPIECE_MAX_NUM_TOKENS"


def test_from_env_empty_values() -> None:
    """An empty flag is false and an empty list is empty; an empty scalar
    leaves the field at its default."""
    env = {var: "" for var in env_variables()}
    cfg = CompileConfig.from_env(env)
    assert cfg.aot is False and cfg.disable_cache is False
    assert cfg.compile_sizes == () and cfg.splitting_ops == ()
    base = CompileConfig()
    assert cfg.max_num_tokens == base.max_num_tokens and cfg.compiler == base.compiler
    assert cfg.cache_dir is None and cfg.model_tag == base.model_tag
    assert cfg.dynamic == base.dynamic and cfg.max_parallel_compiles is None
    non_empty = CompileConfig.from_env({"FXPIECE_AOT": "1", "FXPIECE_COMPILE_SIZES": "4"})
    assert non_empty.aot is True and non_empty.compile_sizes == (4,)


# -- model tag -----------------------------------------------------------------


def test_set_model_tag_nests_and_restores() -> None:
    assert current_model_tag() is None
    with set_model_tag("outer"):
        assert current_model_tag() == fxpiece.context.ModelTag("outer")
        with set_model_tag("enc"):
            tag = current_model_tag()
            assert tag is not None and tag.tag == "enc"
        assert current_model_tag() == fxpiece.context.ModelTag("outer")
        with pytest.raises(RuntimeError), set_model_tag("boom"):
            raise RuntimeError
        assert current_model_tag() == fxpiece.context.ModelTag("outer")
    assert current_model_tag() is None


def test_set_model_tag_threads_are_isolated() -> None:
    barrier = threading.Barrier(2, timeout=10)
    seen: dict[str, Any] = {}

    def worker() -> None:
        seen["start"] = current_model_tag()
        with set_model_tag("thread"):
            barrier.wait()  # main is inside its own block now
            seen["inside"] = current_model_tag()
            barrier.wait()
        seen["after"] = current_model_tag()

    with set_model_tag("main"):
        t = threading.Thread(target=worker)
        t.start()
        barrier.wait()
        main_inside = current_model_tag()
        barrier.wait()
        t.join(10)
    assert main_inside is not None and main_inside.tag == "main"
    assert seen["start"] is None
    assert seen["inside"].tag == "thread"
    assert seen["after"] is None
    assert current_model_tag() is None


@pytest.mark.parametrize("bad", ["../x", "a/b", "/abs", ".git", "", "x..y"])
def test_set_model_tag_rejects_unsafe_names(bad: str) -> None:
    with pytest.raises(ConfigError) as ei, set_model_tag(bad):
        pass
    assert ei.value.field == "model_tag"
    assert current_model_tag() is None


# -- counters ------------------------------------------------------------------


def test_counters_expect_passes_and_fails() -> None:
    c = Counters()
    with c.expect(num_graphs_seen=2, num_cache_hits=0):
        c.add("num_graphs_seen")
        c.add("num_graphs_seen")
        c.add("num_inductor_compiles", 5)  # not named: free to change
    assert c.num_graphs_seen == 2 and c["num_inductor_compiles"] == 5

    with pytest.raises(AssertionError) as ei, c.expect(num_graphs_seen=1, num_cache_hits=1):
        c.add("num_graphs_seen", 2)
    msg = str(ei.value)
    assert "num_graphs_seen: expected +1, got +2" in msg
    assert "num_cache_hits: expected +1, got +0" in msg

    with pytest.raises(AssertionError), c.expect(num_cache_hits=0):
        c.add("num_cache_hits")
    with pytest.raises(KeyError), c.expect(no_such_counter=1):
        pass
    with pytest.raises(KeyError):
        c.add("no_such_counter")
    assert c.snapshot()["num_graphs_seen"] == 4


def test_global_counters_is_a_counters() -> None:
    assert isinstance(fxpiece.counters, Counters)
    with fxpiece.counters.expect(num_eager_compiles=0):
        pass
    with pytest.raises(AttributeError):
        _ = fxpiece.counters.no_such_counter


# -- cache key pin -------------------------------------------------------------
# The config part of the cache key must stay byte-identical (a warm start from
# a cache written before config_factors was generated from field metadata must
# still hit). The literals below were computed by the hand-written
# config_factors of commit a74a935, on torch 2.15 and 2.9.1 alike.


class _FixedPass(fxpiece.InductorPass):
    def __call__(self, graph: torch.fx.Graph) -> None:
        pass

    def uuid(self) -> str:
        return "fixed-pass-v1"


class _Hook:
    def __call__(self, graph: torch.fx.Graph) -> None:
        pass

    def uuid(self) -> str:
        return "hook-v3"


class _MyCompiler(fxpiece.CompilerInterface):
    name = "my-compiler"

    def compile(self, *args: Any) -> Any:  # type: ignore[override]
        raise NotImplementedError


def _pinned_configs() -> dict[str, CompileConfig]:
    return {
        "default": CompileConfig(),
        "full": CompileConfig(
            splitting_ops=[SDPA, ATTENTION_OP, "aten::mm.default", "aten::addmm"],
            compile_ranges_endpoints=[32, 8],
            max_num_tokens=256,
            compile_sizes=[16, 4, 64],
            compiler="eager",
            cache_dir="/tmp/x",
            disable_cache=True,
            inductor_config={
                "max_autotune": True,
                "max_autotune_gemm_backends": "ATEN,TRITON",
                "post_grad_custom_post_pass": _Hook(),
                "cpp.threads": 4,
            },
            post_grad_passes=[_FixedPass()],
            model_tag="enc",
            use_inductor_graph_partition=True,
            strict=True,
            cache_readonly=True,
            require_cache_hit=True,
            allow_untrusted_cache=True,
            lock_timeout=5.0,
            lease_ttl=2.0,
            max_parallel_compiles=3,
            static_graph_wrapper=lambda f, i, e: f,
            dynamic="backed",
            aot=False,
        ),
        "sizes": CompileConfig(
            compile_sizes=[1, 2, 8192],
            compiler="inductor-fx-cache",
            dynamic="unbacked",
            splitting_ops=ATTENTION_OP,
        ),
        "custom_compiler": CompileConfig(
            compiler=_MyCompiler(), compile_ranges_endpoints=[1], max_num_tokens=4
        ),
    }


_PINNED_FACTORS: dict[str, tuple[str, str]] = {
    "default": (
        '{"splitting_ops": [], "compile_entries": [[1, 8192]], "compiler": "inductor", '
        '"inductor_config": {}, "post_grad_passes": [], '
        '"use_inductor_graph_partition": false, "dynamic": "unbacked"}',
        "ee7a59fc6d2e492641c990133048a77816203d03e3557aa22e7e79e359f58c16",
    ),
    "full": (
        '{"splitting_ops": ["aten::addmm", "aten::mm.default", "fxpiece_toy::attention", '
        '"torch.nn.functional.scaled_dot_product_attention"], "compile_entries": [[1, 8], '
        '[9, 32], [33, 256], [4, 4], [16, 16], [64, 64]], "compiler": "eager", '
        '"inductor_config": {"cpp.threads": 4, "max_autotune": true, '
        '"max_autotune_gemm_backends": "ATEN,TRITON", "post_grad_custom_post_pass": '
        '{"uuid": "hook-v3"}}, "post_grad_passes": ["fixed-pass-v1"], '
        '"use_inductor_graph_partition": true, "dynamic": "backed"}',
        "b255854dcf4bf537f47eb30dc666f9df846adb42d24995cc5ac872bc41de9d88",
    ),
    "sizes": (
        '{"splitting_ops": ["fxpiece_toy::attention"], "compile_entries": [[1, 8192], '
        '[1, 1], [2, 2], [8192, 8192]], "compiler": "inductor-fx-cache", '
        '"inductor_config": {}, "post_grad_passes": [], '
        '"use_inductor_graph_partition": false, "dynamic": "unbacked"}',
        "d4273644520d7491472720a75cd9d37c15735786ab9e2d6c38fa4ccbaaeca538",
    ),
    "custom_compiler": (
        '{"splitting_ops": [], "compile_entries": [[1, 1], [2, 4]], "compiler": '
        '"my-compiler", "inductor_config": {}, "post_grad_passes": [], '
        '"use_inductor_graph_partition": false, "dynamic": "unbacked"}',
        "ee83ab1664c5fa7667f97a3d87a443d2804c1e2ab82bb3edbf403359253a86cd",
    ),
}


@pytest.mark.parametrize("name", sorted(_PINNED_FACTORS))
def test_config_factors_are_pinned(name: str) -> None:
    from fxpiece.hashing import hash_factors
    from fxpiece.piecewise.factors import config_factors

    want_json, want_hash = _PINNED_FACTORS[name]
    got = config_factors(_pinned_configs()[name])
    assert json.dumps(got) == want_json  # same factors, same order
    assert hash_factors(got) == want_hash


# -- field metadata ------------------------------------------------------------

# A value other than the default for every field: changing a NotKeyed field
# must leave the key alone, changing a Keyed one must move it. A field added
# without a sample here fails test_every_field_has_a_sample.
_SAMPLES: dict[str, Any] = {
    "splitting_ops": [ATTENTION_OP],
    "compile_ranges_endpoints": [8],
    "max_num_tokens": 64,
    "compile_sizes": [4],
    "compiler": "eager",
    "cache_dir": "/tmp/elsewhere",
    "disable_cache": True,
    "inductor_config": {"max_autotune": True},
    "post_grad_passes": [_FixedPass()],
    "model_tag": "other",
    "use_inductor_graph_partition": True,
    "strict": True,
    "cache_readonly": True,
    "require_cache_hit": True,
    "allow_untrusted_cache": True,
    "lock_timeout": 1.0,
    "lease_ttl": 1.0,
    "max_parallel_compiles": 2,
    "remote_cache": "redis://cache.local:6379/0",
    "static_graph_wrapper": lambda fn, i, e: fn,
    "dynamic": "backed",
    "aot": False,
}

# What from_env read before it was generated from the fields (all 15
# variables, each setting the same field).
_ENV_BEFORE = {
    "FXPIECE_CACHE_ROOT": "cache_dir",
    "FXPIECE_DISABLE_CACHE": "disable_cache",
    "FXPIECE_ALLOW_UNTRUSTED_CACHE": "allow_untrusted_cache",
    "FXPIECE_CACHE_READONLY": "cache_readonly",
    "FXPIECE_REQUIRE_CACHE_HIT": "require_cache_hit",
    "FXPIECE_AOT": "aot",
    "FXPIECE_MAX_PARALLEL_COMPILES": "max_parallel_compiles",
    "FXPIECE_STRICT": "strict",
    "FXPIECE_COMPILER": "compiler",
    "FXPIECE_DYNAMIC": "dynamic",
    "FXPIECE_MODEL_TAG": "model_tag",
    "FXPIECE_SPLITTING_OPS": "splitting_ops",
    "FXPIECE_COMPILE_SIZES": "compile_sizes",
    "FXPIECE_COMPILE_RANGES_ENDPOINTS": "compile_ranges_endpoints",
    "FXPIECE_MAX_NUM_TOKENS": "max_num_tokens",
    "FXPIECE_REMOTE_CACHE": "remote_cache",  # added since (the remote tier)
}


def test_every_field_is_classified() -> None:
    specs = dict(field_specs(CompileConfig))
    assert list(specs) == [f.name for f in dataclasses.fields(CompileConfig)]
    for name, spec in specs.items():
        assert isinstance(spec.key, Keyed | NotKeyed), name
        if isinstance(spec.key, NotKeyed):
            assert len(spec.key.why) > 10, f"{name}: say why it cannot change compiled code"
    keyed = {n for n, s in specs.items() if isinstance(s.key, Keyed)}
    # The seven factors of the key, from these fields.
    assert keyed == {
        "splitting_ops",
        "compile_ranges_endpoints",
        "max_num_tokens",
        "compile_sizes",
        "compiler",
        "inductor_config",
        "post_grad_passes",
        "use_inductor_graph_partition",
        "dynamic",
    }


def test_an_unclassified_field_fails() -> None:
    @dataclasses.dataclass(frozen=True)
    class Plain:
        a: int = option(1, key=Keyed())
        b: int = 2

    with pytest.raises(TypeError, match=r"Plain\.b is not classified for the cache key"):
        field_specs(Plain)

    @dataclasses.dataclass(frozen=True)
    class OtherMetadata:
        a: int = dataclasses.field(default=1, metadata={"doc": "x"})

    with pytest.raises(TypeError, match=r"OtherMetadata\.a is not classified"):
        field_specs(OtherMetadata)


def test_one_factor_one_renderer_and_one_field_per_variable() -> None:
    @dataclasses.dataclass(frozen=True)
    class TwoRenders:
        a: int = option(1, key=Keyed("ab", render=lambda c: 1))
        b: int = option(2, key=Keyed("ab", render=lambda c: 2))

    with pytest.raises(TypeError, match=r"TwoRenders\.b: factor 'ab' is rendered differently"):
        field_specs(TwoRenders)

    @dataclasses.dataclass(frozen=True)
    class SameVar:
        a: int = option(1, key=NotKeyed("not keyed here"), env=EnvVar("X", lambda n, r: 1))
        b: int = option(2, key=NotKeyed("not keyed here"), env=EnvVar("X", lambda n, r: 2))

    with pytest.raises(TypeError, match=r"SameVar\.b: X already sets a"):
        field_specs(SameVar)


def test_every_field_has_a_sample() -> None:
    assert set(_SAMPLES) == {f.name for f in dataclasses.fields(CompileConfig)}


@pytest.mark.parametrize("name", sorted(_SAMPLES))
def test_only_keyed_fields_change_the_key(name: str) -> None:
    spec = dict(field_specs(CompileConfig))[name]
    base = CompileConfig(max_num_tokens=128)
    changes = {name: _SAMPLES[name]}
    if name == "compile_ranges_endpoints":
        changes["max_num_tokens"] = 128
    other = CompileConfig(**{"max_num_tokens": 128, **changes})
    same = config_factors(other) == config_factors(base)
    assert same is isinstance(spec.key, NotKeyed), name


def test_from_env_reads_the_same_variables_as_before() -> None:
    assert env_variables() == _ENV_BEFORE


def test_every_variable_sets_its_field(tmp_path: Path) -> None:
    env = {
        "FXPIECE_CACHE_ROOT": str(tmp_path),
        "FXPIECE_DISABLE_CACHE": "1",
        "FXPIECE_ALLOW_UNTRUSTED_CACHE": "on",
        "FXPIECE_CACHE_READONLY": "yes",
        "FXPIECE_REQUIRE_CACHE_HIT": "true",
        "FXPIECE_AOT": "0",
        "FXPIECE_MAX_PARALLEL_COMPILES": " 3 ",
        "FXPIECE_STRICT": "1",
        "FXPIECE_COMPILER": "eager",
        "FXPIECE_DYNAMIC": "UNBACKED",
        "FXPIECE_MODEL_TAG": "enc",
        "FXPIECE_SPLITTING_OPS": ATTENTION_OP,
        "FXPIECE_COMPILE_SIZES": "2",
        "FXPIECE_COMPILE_RANGES_ENDPOINTS": "16",
        "FXPIECE_MAX_NUM_TOKENS": "64",
        "FXPIECE_REMOTE_CACHE": "redis://cache.local:6379/2",
    }
    assert set(env) == set(env_variables())
    base = CompileConfig()
    for var, field in env_variables().items():
        cfg = CompileConfig.from_env({var: env[var]})
        assert getattr(cfg, field) != getattr(base, field), var
        others = [f.name for f in dataclasses.fields(CompileConfig) if f.name != field]
        assert all(getattr(cfg, f) == getattr(base, f) for f in others), var
    cfg = CompileConfig.from_env(env)
    assert cfg.max_parallel_compiles == 3 and cfg.dynamic == "unbacked" and cfg.aot is False


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://cache:6379/0", "the scheme must be one of redis, rediss, unix"),
        ("redis://", "names no host"),
        ("redis://cache/zero", "the path must be a database number"),
        ("redis://cache:port/0", "is not a valid URL"),
        ("unix://", "names no socket path"),
    ],
)
def test_remote_cache_is_validated(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=f"^remote_cache: .*{problem}") as e:
        CompileConfig(remote_cache=url)
    assert "secret" not in str(e.value)
    with pytest.raises(ConfigError, match="FXPIECE_REMOTE_CACHE"):
        CompileConfig.from_env({"FXPIECE_REMOTE_CACHE": url})


def test_remote_cache_error_never_shows_the_password() -> None:
    with pytest.raises(ConfigError) as e:
        CompileConfig(remote_cache="redis://user:secret@cache/zero")
    assert "secret" not in str(e.value) and "cache/zero" in str(e.value)


@pytest.mark.parametrize("mode", DYNAMIC_MODES)
def test_every_dynamic_mode_resolves(mode: str) -> None:
    from fxpiece.piecewise import _torch_compat

    assert _torch_compat.resolve_dynamic(mode) in ("backed", "unbacked")
    assert config_factors(CompileConfig(dynamic=mode))["dynamic"] in ("backed", "unbacked")


def test_config_imports_nothing_that_imports_it_back() -> None:
    """``fxpiece.config`` is at the bottom: no module it imports, at import
    or lazily inside a function, imports it back (TYPE_CHECKING imports
    aside)."""
    graph = _import_graph(Path(fxpiece.__file__).parent)
    reached: dict[str, str | None] = {"fxpiece.config": None}
    todo = ["fxpiece.config"]
    while todo:
        mod = todo.pop()
        for dep in sorted(graph[mod]):
            if dep == "fxpiece.config":
                chain = [mod]
                while (parent := reached[chain[-1]]) is not None:
                    chain.append(parent)
                pytest.fail("import circle: " + " <- ".join(["fxpiece.config", *chain]))
            if dep not in reached:
                reached[dep] = mod
                todo.append(dep)
    # Lazy imports are followed: the torch-facing checks config calls.
    assert {"fxpiece.piecewise.passes", "fxpiece.piecewise._torch_compat"} <= set(reached)


def _import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Every module of the package with the package modules it imports:
    every import statement, lazy ones inside functions included, but not
    those under ``if TYPE_CHECKING:``; importing ``a.b.c`` counts ``a`` and
    ``a.b`` too (their ``__init__`` runs)."""
    root = package_dir.parent
    files: dict[str, Path] = {}
    for path in package_dir.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        type_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        named: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                named.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                named.add(base)
                named.update(f"{base}.{a.name}" for a in node.names)
        deps: set[str] = set()
        for mod in named:
            parts = mod.split(".")
            deps.update(
                ".".join(parts[:i])
                for i in range(1, len(parts) + 1)
                if ".".join(parts[:i]) in files
            )
        deps.discard(name)
        graph[name] = deps
    return graph
