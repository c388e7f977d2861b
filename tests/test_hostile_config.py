"""Hostile config values: refused naming the field, never imported while
validating, and any values either build a sane config or raise ConfigError.
(The lease half is in core/test_hostile_leases.py: it runs without torch.)"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fxpiece

# -- config ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_num_tokens", 2**64),
        ("max_num_tokens", 0),
        ("compile_sizes", [2**40]),
        ("cache_dir", "/tmp/a\x00b"),
        ("lease_ttl", math.inf),
        ("lease_ttl", math.nan),
        ("lease_ttl", 1e-9),
        ("lock_timeout", -1),
        ("lock_timeout", math.inf),
        ("splitting_ops", 5),
        ("splitting_ops", [5]),
        ("model_tag", "backbone\n"),
        ("inductor_config", {"epilogue_fusion": object()}),
        ("inductor_config", {"epilogue_fusion": math.nan}),
        ("inductor_config", {"no_such_option": 1}),
        ("strict", "yes"),
    ],
)
def test_bad_config_values_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(fxpiece.ConfigError) as ei:
        fxpiece.CompileConfig(**{field: value})
    assert ei.value.field == field and isinstance(ei.value, fxpiece.FxpieceError)


def test_dotted_splitting_op_is_not_imported_while_validating(tmp_path: Path) -> None:
    mod = tmp_path / "evil_mod_fxp.py"
    marker = tmp_path / "ran"
    mod.write_text(f"open({str(marker)!r}, 'w').close()\ndef op(x):\n    return x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        fxpiece.CompileConfig(splitting_ops=["evil_mod_fxp.op"])
        fxpiece.CompileConfig.from_env({"FXPIECE_SPLITTING_OPS": "evil_mod_fxp.op"})
        assert not marker.exists(), "validating a config ran a module's top-level code"
        assert "evil_mod_fxp" not in sys.modules
    finally:
        sys.path.remove(str(tmp_path))


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(min_value=-5, max_value=2**40), max_size=4),
)
_fields = [
    "max_num_tokens",
    "compile_sizes",
    "compile_ranges_endpoints",
    "lease_ttl",
    "lock_timeout",
    "model_tag",
    "cache_dir",
    "strict",
    "compiler",
]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_fields), _values, max_size=4))
def test_config_construction_fuzz(kw: dict[str, Any]) -> None:
    """Any values: a valid config whose numbers are finite and in range, or a
    ConfigError naming a field, never anything else."""
    try:
        cfg = fxpiece.CompileConfig(**kw)
    except fxpiece.ConfigError as e:
        assert e.field in _fields
        return
    assert 1 <= cfg.max_num_tokens < 2**31
    assert all(1 <= s <= cfg.max_num_tokens for s in cfg.compile_sizes)
    assert math.isfinite(cfg.lease_ttl) and cfg.lease_ttl > 0
    assert math.isfinite(cfg.lock_timeout) and cfg.lock_timeout > 0
