"""The piecewise backend end to end on the toy Llama (hidden 64).

Compiler "eager" wherever Inductor is not the point; the Inductor runs share
module-scoped fixtures (one cold compile each) and the warm starts run in
fresh subprocesses.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import (
    TESTS_DIR,
    PyRunner,
    RecordRange,
    counter_diff,
    make_toy,
    run_toy,
    run_toy_subprocess,
    snapshot_files,
    token_ids,
)

import fxpiece
from fxpiece import CacheIndex, CompileConfig, ConfigError, Range, SizeOutOfRangeError
from fxpiece.cache.entries import MODEL_KERNELS, EntryIndex, KernelsKey, PieceKey, decode_key
from fxpiece.piecewise import _torch_compat
from fxpiece.piecewise.factors import config_factors
from fxpiece.toy_llama import ATTENTION_OP

ATT = ATTENTION_OP
SDPA = "torch.nn.functional.scaled_dot_product_attention"

# The small eager setup: ranges [1,8] [9,32] and the exact size 4.
EAGER_ENTRIES: dict[str, Any] = {
    "compile_ranges_endpoints": [8],
    "compile_sizes": [4],
    "max_num_tokens": 32,
}
EAGER_ENTRY_NAMES = ["[1,8]", "[9,32]", "4"]


def eager_config(**kw: Any) -> CompileConfig:
    base: dict[str, Any] = {"splitting_ops": [ATT], "compiler": "eager", **EAGER_ENTRIES}
    base.update(kw)
    return CompileConfig(**base)


def reference(layers: int, sizes: list[int], dtype: str = "float32", sdpa: bool = False) -> dict:
    model = make_toy(layers, dtype, sdpa)
    with torch.no_grad():
        return {n: model(token_ids(n)) for n in sizes}


def run(cm: Any, n: int) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = cm(token_ids(n))
    return out


def strings_in(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings_in(k)
            yield from strings_in(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from strings_in(v)


def assert_counts(diff: dict[str, int], **want: int) -> None:
    """Each named counter changed by exactly ``want`` (0 when absent from ``diff``)."""
    got = {k: diff.get(k, 0) for k in want}
    assert got == want, f"counter diffs {got} != expected {want} (all: {diff})"


def factors_diff(folder_a: str | Path, folder_b: str | Path) -> str:
    """Which key-factor groups differ between two model folders (for messages)."""
    try:
        a = json.loads((Path(folder_a) / "cache_key_factors.json").read_text())
        b = json.loads((Path(folder_b) / "cache_key_factors.json").read_text())
    except OSError as e:
        return f"(cannot read factors: {e})"
    out = []
    for group in sorted(set(a) | set(b)):
        if a.get(group) != b.get(group):
            out.append(f"{group}: {a.get(group)!r} != {b.get(group)!r}")
    return "; ".join(out)[:3000]


# -- counters, outputs, pieces (eager) ---------------------------------------


@pytest.mark.compat
@pytest.mark.parametrize("layers", [0, 1, 3])
def test_counters_and_outputs_eager(layers: int) -> None:
    model = make_toy(layers)
    cm = fxpiece.compile(model, eager_config(disable_cache=True))
    n_pieces = 2 * layers + 1 if layers else 1
    n_compiled = layers + 1
    n_unique = min(layers + 1, 3)  # middle pieces of a 3-layer model are identical
    expected = {
        "num_graphs_seen": 1,
        "num_piecewise_graphs_seen": n_pieces,
        "num_piecewise_capturable_graphs_seen": n_compiled,
        "num_backend_compilations": n_compiled * 3,
        "num_eager_compiles": n_unique * 3,
        "num_inductor_compiles": 0,
        # Entries of a piece identical to an earlier one count as hits.
        "num_cache_hits": (n_compiled - n_unique) * 3,
        "num_cache_entries_updated": 0,
        "num_compiled_artifacts_saved": 0,
        "num_uncompiled_runs": 0,
    }
    sizes = [1, 4, 9, 32, 5]
    with fxpiece.counters.expect(**expected):
        for n in sizes:
            torch.testing.assert_close(run(cm, n), run(model, n))
    # The backend's own counters saw the same.
    mine = cm.stats.counters.snapshot()
    assert {k: mine[k] for k in expected} == expected
    assert len(cm.stats.graphs) == 1
    g = cm.stats.graphs[0]
    assert g.num_pieces == n_pieces and g.num_compiled_pieces == n_compiled
    assert g.cache_key is None and g.cache_folder is None
    kinds = [p.is_splitting_graph for p in g.pieces]
    assert kinds == [i % 2 == 1 for i in range(n_pieces)]
    for p in g.pieces:
        if p.is_splitting_graph:
            assert p.split_op == ATT and p.entries == [] and p.num_nodes >= 1
        else:
            assert p.entries == EAGER_ENTRY_NAMES
            assert p.compiled + p.reused == 3 and p.loaded == 0
    assert sum(p.reused for p in g.pieces) == (n_compiled - n_unique) * 3
    if layers == 3:
        assert [p.reused for p in g.pieces] == [0, 0, 0, 0, 3, 0, 0]
    want = {1: Range(1, 8), 4: Range(4, 4), 9: Range(9, 32), 32: Range(9, 32), 5: Range(1, 8)}
    assert [r.index for r in g.runners] == [p.index for p in g.pieces if not p.is_splitting_graph]
    for r in g.runners:
        assert r.chosen == want, r.index


def test_split_at_a_callable_sdpa() -> None:
    model = make_toy(2, sdpa=True)
    cm = fxpiece.compile(model, eager_config(splitting_ops=[SDPA], disable_cache=True))
    with fxpiece.counters.expect(
        num_graphs_seen=1,
        num_piecewise_graphs_seen=5,
        num_piecewise_capturable_graphs_seen=3,
        num_backend_compilations=9,
    ):
        for n in (3, 4, 12):
            torch.testing.assert_close(run(cm, n), run(model, n))
    g = cm.stats.graphs[0]
    assert [p.split_op for p in g.pieces] == [None, SDPA, None, SDPA, None]


def test_strict_raises_outside_every_range() -> None:
    model = make_toy(1)
    cm = fxpiece.compile(model, eager_config(disable_cache=True, strict=True))
    torch.testing.assert_close(run(cm, 32), run(model, 32))
    with fxpiece.counters.expect(num_uncompiled_runs=0), pytest.raises(SizeOutOfRangeError) as ei:
        run(cm, 40)
    assert isinstance(ei.value, ValueError)
    assert "40" in str(ei.value)


def test_graph_partition_rejects_callables() -> None:
    cfg = CompileConfig(splitting_ops=[SDPA], use_inductor_graph_partition=True, compiler="eager")
    with pytest.raises(ConfigError) as ei:
        fxpiece.Backend(cfg)
    assert ei.value.field == "use_inductor_graph_partition"


# -- static-graph wrapper hook -------------------------------------------------


def test_static_graph_wrapper_only_for_exact_sizes() -> None:
    created: list[tuple[int, Range]] = []
    calls: list[tuple[int, Range, int]] = []

    def factory(fn: Callable[..., Any], piece_index: int, entry: Range) -> Callable[..., Any]:
        created.append((piece_index, entry))

        def wrapped(*args: Any) -> Any:
            size = next(a for a in args if isinstance(a, int) and not isinstance(a, bool))
            calls.append((piece_index, entry, size))
            return fn(*args)

        return wrapped

    model = make_toy(2)
    cfg = eager_config(
        disable_cache=True,
        compile_sizes=[4, 16],
        static_graph_wrapper=factory,
    )
    cm = fxpiece.compile(model, cfg)
    torch.testing.assert_close(run(cm, 5), run(model, 5))
    compiled = [0, 2, 4]
    want = {(p, Range(s, s)) for p in compiled for s in (4, 16)}
    assert len(created) == len(want) and set(created) == want
    assert calls == []  # 5 is served by a range: not wrapped
    for n in (4, 20, 16, 4):
        torch.testing.assert_close(run(cm, n), run(model, n))
    assert Counter((p, e.start, s) for p, e, s in calls) == Counter(
        {**{(p, 4, 4): 2 for p in compiled}, **{(p, 16, 16): 1 for p in compiled}}
    )
    assert all(e.start == s for _, e, s in calls)


def test_static_input_buffers_wrapper() -> None:
    from fxpiece.wrappers import StaticInputBuffers

    instances: list[Any] = []

    class Recording(StaticInputBuffers):
        def __init__(self, fn: Callable[..., Any], piece_index: int, entry: Range) -> None:
            super().__init__(fn, piece_index, entry)
            self.addresses: list[tuple[int, ...]] = []
            instances.append(self)

        def run(self, *args: Any) -> Any:
            self.addresses.append(
                tuple(
                    a.data_ptr()
                    for a in args
                    if isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter)
                )
            )
            return super().run(*args)

    model = make_toy(1)
    cm = fxpiece.compile(model, eager_config(disable_cache=True, static_graph_wrapper=Recording))
    assert instances == []
    for n, shift in [(4, 0), (9, 0), (4, 1), (4, 2)]:
        ids = (token_ids(n) + shift) % 512
        with torch.no_grad():
            torch.testing.assert_close(cm(ids), model(ids))
    assert sorted((w.piece_index, w.entry) for w in instances) == [
        (0, Range(4, 4)),
        (2, Range(4, 4)),
    ]
    for w in instances:
        assert len(w.addresses) == 3  # size 4 three times; 9 is served by a range
        assert len(set(w.addresses)) == 1 and w.addresses[0]  # the same buffers each call
        assert w.copies == 3 * len(w.addresses[0])


def test_static_input_buffers_unit() -> None:
    from fxpiece.wrappers import StaticInputBuffers

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def fn(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        seen.append((x, p))
        return x * p

    param = torch.nn.Parameter(torch.full((3,), 2.0), requires_grad=False)
    w = StaticInputBuffers(fn, 1, Range(3, 3))
    a, b = torch.ones(3), torch.arange(3.0)
    assert w(a, param).tolist() == [2.0, 2.0, 2.0]
    assert w(b, param).tolist() == [0.0, 2.0, 4.0]
    (x1, p1), (x2, p2) = seen
    assert x1.data_ptr() == x2.data_ptr()  # one static buffer
    assert x1.data_ptr() not in (a.data_ptr(), b.data_ptr())  # a copy, not the input
    assert p1 is param and p2 is param  # parameters pass through
    assert w.copies == 2
    with pytest.raises(ValueError, match="static buffer"):
        w(torch.ones(4), param)


# -- ranges and sizes with Inductor (one cold compile, shared) --------------------

RANGE_SIZES = [1, 8, 9, 16, 20, 64, 100]
RANGE_ENTRIES = [Range(1, 8), Range(9, 32), Range(33, 128), Range(16, 16), Range(64, 64)]
RANGE_LAYERS = 3  # pieces 0..6: compiled 0, 2, 4, 6; 2 and 4 are identical


def range_spec(cache: Path, out: Path | None = None) -> dict[str, Any]:
    return {
        "layers": RANGE_LAYERS,
        "config": {
            "splitting_ops": [ATT],
            "compiler": "inductor",
            "cache_dir": str(cache),
            "compile_ranges_endpoints": [8, 32],
            "compile_sizes": [16, 64],
            "max_num_tokens": 128,
        },
        "pass_tag": "ranges",
        "sizes": RANGE_SIZES,
        "out": str(out) if out else None,
    }


@pytest.fixture(scope="module")
def ranges_run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("ranges")
    torch._dynamo.reset()
    keep: dict[str, Any] = {}
    result = run_toy(range_spec(root / "cache", root / "cold.pt"), keep)
    cm = keep["cm"]
    ns = SimpleNamespace(root=root, cache=root / "cache", result=result, **keep)
    ns.ref = reference(RANGE_LAYERS, [*RANGE_SIZES, 200, 150])

    def outside(sizes: list[int]) -> tuple[list[warnings.WarningMessage], dict[str, int], list]:
        before = fxpiece.counters.snapshot()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            outs = [run(cm, n) for n in sizes]
        mine = [w for w in rec if "fxpiece" in str(w.message)]
        return mine, counter_diff(before, fxpiece.counters.snapshot()), outs

    ns.first_200 = outside([200])
    ns.again = outside([200, 150])
    return ns


@pytest.mark.compat
@pytest.mark.slow
def test_ranges_compile_counts(ranges_run: SimpleNamespace) -> None:
    r = ranges_run.result
    entries = len(RANGE_ENTRIES)
    # 4 compiled pieces x 5 entries; piece 4 equals piece 2: 3 x 5 real compiles.
    assert_counts(
        r["diff"],
        num_graphs_seen=1,
        num_piecewise_graphs_seen=7,
        num_piecewise_capturable_graphs_seen=4,
        num_backend_compilations=4 * entries,
        num_inductor_compiles=3 * entries,
        num_eager_compiles=0,
        num_cache_hits=entries,  # piece 4's entries, served by piece 2's
        num_cache_misses=3 * entries,
        num_cache_entries_updated=3 * entries,
        num_compiled_artifacts_saved=3 * entries,
        num_uncompiled_runs=0,
    )
    # Everything is compiled before the first call returns; later sizes add nothing.
    assert r["diff_first"] == r["diff"]
    assert r["compiled"] == [5, 0, 5, 0, 0, 0, 5]
    assert r["reused"] == [0, 0, 0, 0, 5, 0, 0]
    assert r["num_graphs"] == 1
    g = ranges_run.cm.stats.graphs[0]
    for p in g.pieces:
        if not p.is_splitting_graph:
            assert p.entries == [str(e) for e in RANGE_ENTRIES]


@pytest.mark.compat
@pytest.mark.slow
def test_ranges_pass_sees_each_compile_range(ranges_run: SimpleNamespace) -> None:
    seen = ranges_run.result["pass_seen"]
    assert Counter(seen) == {str(e): 3 for e in RANGE_ENTRIES}


@pytest.mark.compat
@pytest.mark.slow
def test_ranges_entry_chosen_per_token_count(ranges_run: SimpleNamespace) -> None:
    want = {
        1: Range(1, 8),
        8: Range(1, 8),
        9: Range(9, 32),
        16: Range(16, 16),
        20: Range(9, 32),
        64: Range(64, 64),
        100: Range(33, 128),
        200: None,
        150: None,
    }
    runners = ranges_run.cm.stats.graphs[0].runners
    assert [r.index for r in runners] == [0, 2, 4, 6]
    for r in runners:
        assert r.chosen == want, r.index


@pytest.mark.compat
@pytest.mark.slow
def test_ranges_outputs_match_eager(ranges_run: SimpleNamespace) -> None:
    for n in RANGE_SIZES:
        out = ranges_run.outs[n]
        assert out.shape == (n, 64)
        torch.testing.assert_close(out, ranges_run.ref[n], rtol=1e-4, atol=1e-5)


@pytest.mark.compat
@pytest.mark.slow
def test_ranges_no_recompiles_across_sizes(ranges_run: SimpleNamespace) -> None:
    assert ranges_run.result["diff"]["num_graphs_seen"] == 1
    assert "num_graphs_seen" not in ranges_run.first_200[1]
    assert "num_graphs_seen" not in ranges_run.again[1]
    assert len(ranges_run.cm.stats.graphs) == 1


@pytest.mark.compat
@pytest.mark.slow
def test_size_outside_every_range_runs_uncompiled(ranges_run: SimpleNamespace) -> None:
    warned, diff, outs = ranges_run.first_200
    # One warning per compiled piece, on its first out-of-range size only.
    assert len(warned) == 4
    assert all(issubclass(w.category, RuntimeWarning) for w in warned)
    assert all("200" in str(w.message) for w in warned)
    assert_counts(diff, num_uncompiled_runs=4, num_graphs_seen=0, num_backend_compilations=0)
    torch.testing.assert_close(outs[0], ranges_run.ref[200], rtol=1e-4, atol=1e-5)
    warned, diff, outs = ranges_run.again
    assert warned == []
    assert_counts(diff, num_uncompiled_runs=8, num_graphs_seen=0, num_backend_compilations=0)
    torch.testing.assert_close(outs[1], ranges_run.ref[150], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_cache_folder_files_and_relative_handles(ranges_run: SimpleNamespace) -> None:
    g = ranges_run.cm.stats.graphs[0]
    cache = ranges_run.cache
    folder = g.cache_folder
    assert folder is not None and folder.is_dir()
    assert folder.is_relative_to(cache / "models")
    assert sorted(os.listdir(folder)) == ["cache_key_factors.json", "computation_graph.py", "index"]
    factors_text = (folder / "cache_key_factors.json").read_text()
    factors = json.loads(factors_text)
    assert {"env", "config", "inductor", "graph", "code", "compiler"} <= set(factors)
    assert str(cache) not in factors_text and str(ranges_run.root) not in factors_text
    graph_text = (folder / "computation_graph.py").read_text()
    assert graph_text.count(f"SPLIT at {ATT}") == 3
    ast.parse(graph_text)
    entries = CacheIndex(str(folder / "index")).entries()
    # Kernel bundles (what Inductor built, for loads to rebuild nothing) have
    # their own keys: one beside each piece entry whose compile built kernels.
    kernels = {decode_key(k): v for k, v in entries if isinstance(decode_key(k), KernelsKey)}
    assert kernels
    assert all(v["handle"]["artifact"].startswith("artifacts/") for v in kernels.values())
    entries = [(k, v) for k, v in entries if isinstance(decode_key(k), PieceKey)]
    assert len(entries) == 15
    per_piece = kernels.keys() - {MODEL_KERNELS}
    typed = [decode_key(k) for k, _ in entries]
    assert per_piece <= {k.kernels() for k in typed if isinstance(k, PieceKey)}
    assert len(per_piece) >= 3  # at least the first entry of each piece
    keys = {k for k, _ in entries}
    assert {(k[0], k[1]) for k in keys} == {(e.start, e.end) for e in RANGE_ENTRIES}
    assert {k[2] for k in keys} == {0, 2, 6}
    for key, value in entries:
        for s in strings_in(value):
            assert not os.path.isabs(s), (key, s)
            assert str(cache) not in s and str(ranges_run.root) not in s, (key, s)
        artifact = value["handle"]["artifact"]
        assert (cache / artifact).is_file(), artifact


@pytest.mark.compat
@pytest.mark.slow
def test_warm_start_inductor_fresh_process(
    ranges_run: SimpleNamespace, run_py: PyRunner, tmp_path: Path
) -> None:
    out = tmp_path / "warm.pt"
    r = run_toy_subprocess(run_py, range_spec(ranges_run.cache, out))
    cold = ranges_run.result
    assert r["key"] == cold["key"], factors_diff(r["folder"], cold["folder"])
    d = r["diff"]
    assert d.get("num_inductor_compiles", 0) == 0, d
    assert d.get("num_cache_misses", 0) == 0, d
    assert d["num_cache_hits"] == d["num_backend_compilations"] == 20, d
    # Loaded from the cache, except the piece equal to an earlier one (served
    # by that one's loaded entries).
    assert r["loaded"] == [5, 0, 5, 0, 0, 0, 5]
    assert r["reused"] == [0, 0, 0, 0, 5, 0, 0]
    assert r["compiled"] == [0] * 7
    assert r["pass_seen"] == []  # Inductor never ran
    warm = torch.load(out)
    for n in RANGE_SIZES:
        torch.testing.assert_close(warm[n], ranges_run.outs[n], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(warm[n], ranges_run.ref[n], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_piece_loaded_before_the_model_bundle_rebuilds_no_kernel(
    ranges_run: SimpleNamespace, run_py: PyRunner, tmp_path: Path
) -> None:
    """A process that loads pieces as another one stores them (before that
    one stores its model-level bundle) gets each piece's kernels with it."""
    cache = tmp_path / "cache"
    shutil.copytree(ranges_run.cache, cache, symlinks=True)
    index = CacheIndex(
        str(Path(ranges_run.result["folder"].replace(str(ranges_run.cache), str(cache))) / "index")
    )
    EntryIndex(index).remove(MODEL_KERNELS)  # as if the compiling process had not finished
    assert any(isinstance(decode_key(k), KernelsKey) for k, _ in index.entries())  # the pieces' own
    out = tmp_path / "warm.pt"
    r = run_toy_subprocess(run_py, range_spec(cache, out))
    assert r["diff"].get("num_inductor_compiles", 0) == 0, r["diff"]
    index.refresh()
    # Nothing was rebuilt while loading, so there was nothing new to bundle.
    assert EntryIndex(index).value(MODEL_KERNELS) is None, "loading the pieces rebuilt kernels"
    warm = torch.load(out)
    for n in RANGE_SIZES:
        torch.testing.assert_close(warm[n], ranges_run.outs[n], rtol=1e-6, atol=1e-6)


def moved_copy(src: Path, tmp_path: Path) -> Path:
    """Copy ``src``, then move (rename) the copy somewhere else."""
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    moved = tmp_path / "elsewhere" / "moved-cache"
    moved.parent.mkdir()
    os.rename(copy, moved)
    return moved


@pytest.mark.slow
def test_key_ignores_home_ports_ranks_cwd_and_cache_location(
    ranges_run: SimpleNamespace, run_py: PyRunner, tmp_path: Path
) -> None:
    """A warm start from a moved cache folder, with every per-process value
    changed, still loads every Inductor artifact."""
    moved = moved_copy(ranges_run.cache, tmp_path)
    home = tmp_path / "home"
    cwd = tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {
        "HOME": str(home),
        "MASTER_PORT": "29517",
        "MASTER_ADDR": "10.9.8.7",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "PYTHONHASHSEED": "123",
    }
    out = tmp_path / "warm.pt"
    r = run_toy_subprocess(run_py, range_spec(moved, out), env=env, cwd=cwd)
    cold = ranges_run.result
    assert r["key"] == cold["key"], factors_diff(r["folder"], cold["folder"])
    assert Path(r["folder"]).is_relative_to(moved)
    d = r["diff"]
    assert d.get("num_inductor_compiles", 0) == 0 and d.get("num_cache_misses", 0) == 0, d
    assert d["num_cache_hits"] == d["num_backend_compilations"] == 20, d
    assert r["loaded"] == [5, 0, 5, 0, 0, 0, 5]
    warm = torch.load(out)
    for n in RANGE_SIZES:
        torch.testing.assert_close(warm[n], ranges_run.outs[n], rtol=1e-6, atol=1e-6)


# -- inductor-fx-cache (cold here, warm in a fresh process) ----------------------


def fx_spec(cache: Path, out: Path | None = None) -> dict[str, Any]:
    return {
        "layers": 1,
        "config": {
            "splitting_ops": [ATT],
            "compiler": "inductor-fx-cache",
            "cache_dir": str(cache),
            "compile_sizes": [4],
            "max_num_tokens": 64,
        },
        "pass_tag": "fx",
        "sizes": [3, 4, 10],
        "out": str(out) if out else None,
    }


@pytest.fixture(scope="module")
def fx_run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("fxcache")
    torch._dynamo.reset()
    keep: dict[str, Any] = {}
    result = run_toy(fx_spec(root / "cache", root / "cold.pt"), keep)
    return SimpleNamespace(root=root, cache=root / "cache", result=result, **keep)


@pytest.mark.compat
def test_fx_cache_cold_compile(fx_run: SimpleNamespace) -> None:
    d = fx_run.result["diff"]
    assert d["num_backend_compilations"] == 4
    assert d["num_inductor_compiles"] == 4
    assert d["num_cache_entries_updated"] == 4
    assert Counter(fx_run.result["pass_seen"]) == {"[1,64]": 2, "4": 2}
    ref = reference(1, [3, 4, 10])
    for n, out in fx_run.outs.items():
        torch.testing.assert_close(out, ref[n], rtol=1e-4, atol=1e-5)
    folder = fx_run.cm.stats.graphs[0].cache_folder
    entries = CacheIndex(str(folder / "index")).entries()
    pieces = [k for k, _ in entries if not isinstance(decode_key(k), KernelsKey)]
    assert len(pieces) == 4 and len(entries) > 4  # 4 pieces, kernel bundles (FX-graph entries)
    for key, value in entries:
        for s in strings_in(value):
            assert not os.path.isabs(s), (key, s)
            assert str(fx_run.root) not in s, (key, s)
        if not isinstance(decode_key(key), KernelsKey):
            assert set(value["handle"]) == {"fx_graph_cache_key"}


@pytest.mark.compat
@pytest.mark.slow
def test_warm_start_fx_cache_fresh_process_moved_folder(
    fx_run: SimpleNamespace, run_py: PyRunner, tmp_path: Path
) -> None:
    # From a moved copy: Inductor's own cache (<cache_root>/inductor) moves along.
    moved = moved_copy(fx_run.cache, tmp_path)
    out = tmp_path / "warm.pt"
    r = run_toy_subprocess(run_py, fx_spec(moved, out))
    assert r["key"] == fx_run.result["key"], factors_diff(r["folder"], fx_run.result["folder"])
    assert Path(r["folder"]).is_relative_to(moved)
    d = r["diff"]
    assert d.get("num_inductor_compiles", 0) == 0, d
    assert d["num_cache_hits"] == d["num_backend_compilations"] == 4, d
    assert r["pass_seen"] == []
    warm = torch.load(out)
    for n, cold in fx_run.outs.items():
        torch.testing.assert_close(warm[n], cold, rtol=1e-6, atol=1e-6)


# -- BF16 through Inductor ---------------------------------------------------------


@pytest.mark.compat
def test_bf16_inductor_matches_eager(cache_root: Path) -> None:
    model = make_toy(1, "bfloat16")
    cfg = CompileConfig(
        splitting_ops=[ATT],
        compiler="inductor",
        cache_dir=str(cache_root),
        disable_cache=True,
        max_num_tokens=64,
    )
    cm = fxpiece.compile(model, cfg)
    with fxpiece.counters.expect(num_inductor_compiles=2, num_backend_compilations=2):
        for n in (1, 5, 17):
            out = run(cm, n)
            assert out.dtype == torch.bfloat16 and out.shape == (n, 64)
            ref = run(model, n)
            torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    assert not cache_root.exists(), snapshot_files(cache_root)


# -- token dims: backed and unbacked (config.dynamic) ------------------------------


class TokenModel(torch.nn.Module):
    """Handles 0 tokens (the toy Llama's ``view(t, h, -1)`` cannot, eager
    included); its bias add broadcasts over the token dim."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * x.shape[0]


TOKEN_SIZES = [3, 1, 0, 9, 2]


def _token_run(cfg: CompileConfig, sizes: list[int]) -> tuple[Any, dict[str, int]]:
    model = TokenModel().eval()
    cm = fxpiece.compile(model, cfg)
    before = fxpiece.counters.snapshot()
    with (
        torch.no_grad(),
        pytest.warns(RuntimeWarning, match=r"token count 0\b.* is outside every compiled entry"),
    ):
        for n in sizes:
            x = torch.randn(n, 8)
            torch.testing.assert_close(cm(x), model(x))
    return cm, counter_diff(before, fxpiece.counters.snapshot())


def _token_config(**kw: Any) -> CompileConfig:
    base: dict[str, Any] = {
        "compile_ranges_endpoints": [8],
        "max_num_tokens": 32,
        "disable_cache": True,
    }
    return CompileConfig(**(base | kw))


@pytest.mark.compat
def test_dynamic_auto_resolves_per_torch() -> None:
    assert _torch_compat.resolve_dynamic("auto") == "unbacked"
    assert _torch_compat.resolve_dynamic("backed") == "backed"
    assert config_factors(CompileConfig())["dynamic"] == "unbacked"
    assert config_factors(CompileConfig(dynamic="backed"))["dynamic"] == "backed"


@pytest.mark.compat
@pytest.mark.parametrize("mode", ["unbacked", "backed"])
@pytest.mark.parametrize("first", [3, 1, 0])
def test_one_graph_for_every_token_count_eager(mode: str, first: int) -> None:
    """Dynamo specialises neither 0 nor 1 in either mode (backed dims are
    traced with backed_size_oblivious); 0 is outside every range, so it
    runs uncompiled."""
    sizes = [first, *[n for n in TOKEN_SIZES if n != first]]
    cm, diff = _token_run(_token_config(compiler="eager", dynamic=mode), sizes)
    assert_counts(diff, num_graphs_seen=1, num_eager_compiles=2, num_uncompiled_runs=1)
    (runner,) = cm.stats.graphs[0].runners
    assert runner.chosen[0] is None and runner.chosen[1] == Range(1, 8)


@pytest.mark.compat
@pytest.mark.parametrize("mode", ["unbacked", "backed"])
def test_token_counts_0_and_1_with_inductor(mode: str) -> None:
    """Unbacked: one graph. Backed: one graph too, except where Inductor
    guards the token count against 1 on every broadcast (torch 2.9): there 1
    gets a graph of its own, served by the same artifacts (no extra Inductor
    compile), and 0 shares the other graph."""
    cm, diff = _token_run(_token_config(compiler="inductor", dynamic=mode), TOKEN_SIZES)
    own_graph_for_1 = mode == "backed" and _torch_compat.inductor_guards_size_one()
    graphs = 2 if own_graph_for_1 else 1
    assert_counts(diff, num_graphs_seen=graphs, num_inductor_compiles=2, num_uncompiled_runs=1)
    assert len(cm.stats.graphs) == graphs
    if own_graph_for_1:  # graph 0 served 3 (the first call), graph 1 served 1
        assert [r.chosen.get(1) for r in cm.stats.graphs[1].runners] == [Range(1, 8)]
        assert [r.chosen.get(3) for r in cm.stats.graphs[1].runners] == [None]


# -- eager cache: warm start and key truth -------------------------------------------


def eager_spec(cache: Path, out: Path | None = None) -> dict[str, Any]:
    return {
        "layers": 2,
        "config": {"splitting_ops": [ATT], "compiler": "eager", "cache_dir": str(cache)}
        | EAGER_ENTRIES,
        "sizes": [3, 4, 11],
        "out": str(out) if out else None,
    }


@pytest.fixture(scope="module")
def eager_cold(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("eagercache")
    torch._dynamo.reset()
    keep: dict[str, Any] = {}
    result = run_toy(eager_spec(root / "cache", root / "cold.pt"), keep)
    assert result["diff"]["num_eager_compiles"] == 9
    assert result["diff"]["num_cache_entries_updated"] == 9
    return SimpleNamespace(root=root, cache=root / "cache", result=result, **keep)


@pytest.fixture(scope="module")
def eager_warm(eager_cold: SimpleNamespace, run_py: PyRunner) -> SimpleNamespace:
    """A plain warm start; Inductor's default cache dir points at an empty
    folder so we can see what lands outside the cache root."""
    default_dir = eager_cold.root / "inductor-default"
    out = eager_cold.root / "warm.pt"
    r = run_toy_subprocess(
        run_py, eager_spec(eager_cold.cache, out), env={"TORCHINDUCTOR_CACHE_DIR": str(default_dir)}
    )
    return SimpleNamespace(result=r, out=out, default_dir=default_dir)


def test_warm_start_eager_fresh_process(
    eager_cold: SimpleNamespace, eager_warm: SimpleNamespace
) -> None:
    r = eager_warm.result
    assert r["key"] == eager_cold.result["key"], factors_diff(
        r["folder"], eager_cold.result["folder"]
    )
    d = r["diff"]
    assert d.get("num_eager_compiles", 0) == 0 and d.get("num_cache_misses", 0) == 0, d
    assert d["num_cache_hits"] == d["num_backend_compilations"] == 9
    warm = torch.load(eager_warm.out)
    for n, cold in eager_cold.outs.items():
        torch.testing.assert_close(warm[n], cold, rtol=0, atol=0)


def test_nothing_written_outside_cache_root(eager_warm: SimpleNamespace) -> None:
    assert snapshot_files(eager_warm.default_dir) == []


# In-process key truth: misses are decided by the key alone (a fresh process
# could only add per-process differences, which
# test_key_ignores_home_ports_ranks_cwd_and_cache_location rules out).


def _compile_and_run(model: torch.nn.Module, cfg: CompileConfig) -> tuple[Any, dict[str, int]]:
    torch._dynamo.reset()
    cm = fxpiece.compile(model, cfg)
    before = fxpiece.counters.snapshot()
    for n in (3, 4, 11):
        torch.testing.assert_close(run(cm, n), run(model, n))
    return cm.stats.graphs[0], counter_diff(before, fxpiece.counters.snapshot())


KEY_BASE: dict[str, Any] = {"inductor_config": {"max_autotune": False}}


@pytest.mark.parametrize(
    ("change", "hits"),
    [
        ({}, True),
        ({"strict": True}, True),
        ({"compile_sizes": [4, 16]}, False),
        ({"compile_ranges_endpoints": [16]}, False),
        ({"max_num_tokens": 64}, False),
        ({"inductor_config": {"max_autotune": True}}, False),
        ({"splitting_ops": [ATT, "aten::mm"]}, False),
        ({"pass": "b"}, False),
        ({"dynamic": "unbacked"}, True),  # what "auto" is on torch 2.9 to 2.15
        ({"dynamic": "backed"}, False),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v),
)
def test_key_changes_with_config_and_pass_options(
    cache_root: Path, change: dict[str, Any], hits: bool
) -> None:
    model = make_toy(1)
    base = eager_config(cache_dir=str(cache_root), post_grad_passes=[RecordRange("a")], **KEY_BASE)
    g0, d0 = _compile_and_run(model, base)
    assert d0["num_eager_compiles"] == 6 and d0.get("num_cache_hits", 0) == 0
    kw = dict(change)
    if "pass" in kw:
        kw["post_grad_passes"] = [RecordRange(kw.pop("pass"))]
    g1, d1 = _compile_and_run(model, base.replace(**kw))
    n = d1["num_backend_compilations"]
    if hits:
        assert g1.cache_key == g0.cache_key
        assert d1.get("num_cache_hits", 0) == n and d1.get("num_eager_compiles", 0) == 0, d1
    else:
        assert g1.cache_key != g0.cache_key
        assert g1.cache_folder != g0.cache_folder
        assert d1.get("num_cache_hits", 0) == 0 and d1["num_eager_compiles"] == n, d1


def test_pass_uuid_follows_options() -> None:
    assert RecordRange("a").uuid() == RecordRange("a").uuid()
    assert RecordRange("a").uuid() != RecordRange("b").uuid()


MODEL_SRC = (TESTS_DIR / "programs" / "key_model.py").read_text()
"""A model file the test edits (a real module: ruff and mypy check it)."""


def test_key_follows_traced_source_files(
    cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no stale .pyc between edits
    path = tmp_path / "fxp_key_model.py"
    cfg = CompileConfig(splitting_ops=[ATT], compiler="eager", cache_dir=str(cache_root))
    state: dict[str, torch.Tensor] = {}

    def compile_source(src: str, tag: str) -> tuple[Any, dict[str, int], dict[str, Any]]:
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"fxp_key_model_{tag}", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        model = mod.KeyModel().eval()
        if state:
            model.load_state_dict(state)
        else:
            state.update(model.state_dict())
        torch._dynamo.reset()
        cm = fxpiece.compile(model, cfg)
        before = fxpiece.counters.snapshot()
        with torch.no_grad():
            x = torch.randn(5, 16)
            torch.testing.assert_close(cm(x), model(x))
        g = cm.stats.graphs[0]
        factors = json.loads((g.cache_folder / "cache_key_factors.json").read_text())
        return g, counter_diff(before, fxpiece.counters.snapshot()), factors

    g0, d0, f0 = compile_source(MODEL_SRC, "v0")
    assert str(path) in f0["code"]["files"], "the model's file is not among the traced files"
    assert d0["num_eager_compiles"] == 2 and d0.get("num_cache_hits", 0) == 0

    # A code edit that leaves the graph alone: a different source file -> a miss.
    edited = MODEL_SRC.replace(
        "        h = self.lin(x)  # LINE-A",
        "        assert len('no graph change') > 0\n        h = self.lin(x)  # LINE-A",
    )
    assert edited != MODEL_SRC
    g1, d1, f1 = compile_source(edited, "v1")
    assert f1["graph"] == f0["graph"]
    assert f1["code"] != f0["code"]
    assert g1.cache_key != g0.cache_key
    assert d1.get("num_cache_hits", 0) == 0 and d1["num_eager_compiles"] == 2

    # An edit that changes the graph -> a miss again (another key).
    g2, d2, f2 = compile_source(MODEL_SRC.replace("a * 2", "a * 3"), "v2")
    assert f2["graph"] != f0["graph"]
    assert g2.cache_key not in (g0.cache_key, g1.cache_key)
    assert d2.get("num_cache_hits", 0) == 0 and d2["num_eager_compiles"] == 2

    # Back to the original file: the original key, all hits.
    g3, d3, _ = compile_source(MODEL_SRC, "v3")
    assert g3.cache_key == g0.cache_key
    assert d3["num_cache_hits"] == 2 and d3.get("num_eager_compiles", 0) == 0


# -- model tags, disabling the cache, the entry point ---------------------------------


def test_model_tag_selects_the_cache_subfolder(cache_root: Path) -> None:
    model = make_toy(1)
    g0, _ = _compile_and_run(model, eager_config(cache_dir=str(cache_root)))
    assert g0.cache_folder.name == "backbone"
    with fxpiece.set_model_tag("enc"):
        g1, d1 = _compile_and_run(model, eager_config(cache_dir=str(cache_root)))
    assert g1.cache_folder == g0.cache_folder.parent / "enc"
    assert d1.get("num_cache_hits", 0) == 0  # another model's entries
    g2, _ = _compile_and_run(model, eager_config(cache_dir=str(cache_root), model_tag="dec"))
    assert g2.cache_folder == g0.cache_folder.parent / "dec"
    with fxpiece.set_model_tag("enc"):
        _, d3 = _compile_and_run(model, eager_config(cache_dir=str(cache_root), model_tag="dec"))
    assert d3["num_cache_hits"] == 6  # the context tag wins over the config's


def test_fxpiece_disable_cache_env_writes_nothing(cache_root: Path) -> None:
    env = {
        "FXPIECE_DISABLE_CACHE": "1",
        "FXPIECE_CACHE_ROOT": str(cache_root),
        "FXPIECE_COMPILER": "eager",
        "FXPIECE_SPLITTING_OPS": ATT,
    }
    cfg = CompileConfig.from_env(env)
    assert cfg.disable_cache and cfg.resolved_cache_dir() == cache_root
    with fxpiece.counters.expect(num_cache_hits=0, num_cache_entries_updated=0):
        g, d = _compile_and_run(make_toy(1), cfg)
    assert d["num_eager_compiles"] == 2
    assert g.cache_key is None and g.cache_folder is None
    assert not cache_root.exists(), snapshot_files(cache_root)


def test_inductor_force_disable_caches_reads_and_writes_nothing(cache_root: Path) -> None:
    model = make_toy(1)
    cfg = eager_config(cache_dir=str(cache_root))
    with torch._inductor.config.patch(force_disable_caches=True):
        g, d = _compile_and_run(model, cfg)
    assert g.cache_key is None and d.get("num_cache_entries_updated", 0) == 0
    assert not cache_root.exists(), snapshot_files(cache_root)
    # Control: the same compile writes the cache when it is on...
    _, d = _compile_and_run(model, cfg)
    assert d["num_cache_entries_updated"] == 6 and snapshot_files(cache_root)
    files = snapshot_files(cache_root)
    # ...and with force_disable_caches nothing is read from it either.
    with torch._inductor.config.patch(force_disable_caches=True):
        _, d = _compile_and_run(model, cfg)
    assert d.get("num_cache_hits", 0) == 0 and d["num_eager_compiles"] == 6
    assert snapshot_files(cache_root) == files


def test_torch_compile_backend_name_entry_point(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "fxpiece" in torch._dynamo.list_backends(exclude_tags=())
    monkeypatch.setenv("FXPIECE_COMPILER", "eager")
    monkeypatch.setenv("FXPIECE_SPLITTING_OPS", ATT)
    monkeypatch.setenv("FXPIECE_CACHE_ROOT", str(cache_root))
    monkeypatch.setenv("FXPIECE_MAX_NUM_TOKENS", "64")
    model = make_toy(2)
    compiled = torch.compile(model, backend="fxpiece")
    with fxpiece.counters.expect(
        num_graphs_seen=1,
        num_piecewise_graphs_seen=5,
        num_piecewise_capturable_graphs_seen=3,
        num_eager_compiles=3,
        num_cache_entries_updated=3,
        num_inductor_compiles=0,
    ):
        torch.testing.assert_close(run(compiled, 6), run(model, 6))
    models = cache_root / "models"
    assert models.is_dir()
    assert list(models.glob("*/backbone/cache_key_factors.json"))
