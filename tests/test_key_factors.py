"""Unit tests of the key factors that Inductor's config and the process feed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import fxpiece
from fxpiece.piecewise import _torch_compat
from fxpiece.piecewise.factors import env_factors, inductor_factors


def _portable() -> dict[str, Any]:
    return _torch_compat.inductor_config_portable()


@pytest.mark.parametrize("name", sorted(_torch_compat.INDUCTOR_NOT_IN_KEY))
def test_every_denied_inductor_option_exists_and_never_enters_the_key(name: str) -> None:
    cfg = _portable()
    assert name in cfg, f"{name} is not an Inductor option of torch {torch.__version__}: rename it"
    base = inductor_factors({})
    assert name not in base
    value = cfg[name]
    other = (not value) if isinstance(value, bool) else ("x" if isinstance(value, str) else 7)
    assert inductor_factors({name: other}) == base


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("epilogue_fusion", False),
        ("assert_indirect_indexing", False),
        ("cpp.gemm_cache_blocking", "4,1,8"),
        ("cpp.simdlen", 256),
        ("cpp.min_chunk_size", 1),
        ("max_autotune", True),
    ],
)
def test_options_that_change_code_enter_the_key(name: str, value: Any) -> None:
    """The substrings the old deny regex matched (dir, cache, indirect,
    fusion...) no longer hide options that change code."""
    assert name in _portable()
    assert inductor_factors({name: value})[name] != inductor_factors({})[name]


def test_custom_pass_hooks_are_keyed_by_uuid() -> None:
    class P(torch._inductor.custom_graph_pass.CustomGraphPass):
        def __init__(self, u: str) -> None:
            self.u = u

        def __call__(self, graph: torch.fx.Graph) -> None:
            pass

        def uuid(self) -> str:
            return self.u

    a = inductor_factors({"post_grad_custom_post_pass": P("a")})
    b = inductor_factors({"post_grad_custom_post_pass": P("b")})
    assert a["post_grad_custom_post_pass"] == {"uuid": "a"} and a != b
    with pytest.raises(fxpiece.ConfigError, match="uuid"):
        inductor_factors({"post_grad_custom_post_pass": lambda g: None})


def test_env_factors_are_an_exact_allow_list() -> None:
    env = {
        "ATEN_CPU_CAPABILITY": "avx2",
        "TORCHINDUCTOR_DEBUG_COMPILE": "1",
        "TORCHINDUCTOR_CACHE_DIR": "/x",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "FXPIECE_LOCK_TIMEOUT": "9",
        "MASTER_PORT": "1234",
        "HOME": "/h",
    }
    assert env_factors(env) == {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_DEBUG_COMPILE": "1"}


def test_thread_count_is_a_factor() -> None:
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _torch_compat.runtime_factors()
        torch.set_num_threads(2)
        assert _torch_compat.runtime_factors() != one
    finally:
        torch.set_num_threads(n)


def test_freezing_is_refused_with_a_config_error() -> None:
    backend = fxpiece.Backend(fxpiece.CompileConfig(compiler="eager", disable_cache=True))
    with torch._inductor.config.patch(freezing=True):
        f = torch.compile(lambda x: x + 1, backend=backend)
        with pytest.raises(Exception) as ei:
            f(torch.ones(2))
    inner = getattr(ei.value, "inner_exception", ei.value)
    assert isinstance(inner, fxpiece.ConfigError) and "freezing" in str(inner)


_PASS_SOURCES = """
import json, sys
for extra in sys.argv[1:]:
    __import__(extra)
from fxpiece.piecewise.passes import pass_sources
from programs.toy import RecordRange
print(json.dumps(pass_sources(RecordRange)))
"""


def test_a_pass_uuid_does_not_depend_on_what_the_process_imported() -> None:
    """A pass's sources are read from its import graph as files, not from
    what is loaded: a process that has imported fxpiece's remote tier and
    cache admin code (a test run, a CLI user) gives the same uuid as one
    that has not (it did not: modules under an unloaded package were left
    out, so the key differed between processes)."""
    import json
    import subprocess
    import sys

    from programs.run import TESTS_DIR, program_env

    def sources(*extra: str) -> dict[str, str]:
        out = subprocess.run(
            [sys.executable, "-c", _PASS_SOURCES, *extra],
            env=program_env(),
            cwd=TESTS_DIR,
            capture_output=True,
            text=True,
            check=True,
        )
        result: dict[str, str] = json.loads(out.stdout)
        return result

    plain = sources()
    loaded = sources("fxpiece.remote.sync", "fxpiece.cache.admin", "fxpiece.piecewise.backend")
    assert plain == loaded
    # Reached through the import graph, never imported by the first process.
    assert {"fxpiece.remote.redis_store", "fxpiece.cache.admin.scan"} <= set(plain)
