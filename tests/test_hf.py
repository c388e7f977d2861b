"""Hugging Face ``generate()`` compiled piecewise (examples/hf_generate.py):
tokens equal eager; the cold run compiles each unique piece once and every
graph's index points at it; decode steps dispatch to the 1-token entry;
a warm start in a fresh process compiles nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TESTS_DIR

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

EXAMPLE = TESTS_DIR.parent / "examples" / "hf_generate.py"
PROMPT = 7  # the example's default prompt length; max_num_tokens is 8


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _generate(cache: Path, prompt: int = PROMPT) -> dict[str, object]:
    out = _run(
        str(EXAMPLE), "--cache", str(cache), "--new-tokens", "4", "--prompt-len", str(prompt)
    )
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def _index_entries(cache: Path) -> list[dict[str, object]]:
    listing = json.loads(_run("-m", "fxpiece", "cache", "ls", "--json", str(cache)))
    return [
        e
        for m in listing["models"]
        for e in m["entries"]
        if e["compiler"] != "aot"  # the model's ahead-of-time record, not a piece
    ]


def test_generate_compiles_unique_pieces_once_dispatches_decode_to_one_token(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    cold = _generate(cache)
    assert cold["tokens_equal_eager"] is True
    assert isinstance(cold["graphs"], int) and cold["graphs"] > 1  # prefill + decode graphs
    entries = _index_entries(cache)
    # Every (graph, piece, entry) built has an index entry, and the compiles
    # equal the distinct artifacts they point at: pieces shared between
    # graphs were compiled once.
    assert len(entries) == cold["entries_built"], (entries, cold)
    assert cold["inductor_compiles"] == len({e["digest"] for e in entries}), cold
    assert len({e["digest"] for e in entries}) < len(entries)  # some piece is shared
    # Prefill runs the range entry for the prompt's length; every decode step
    # (KV cache longer than max_num_tokens) runs the exact entry for 1 token.
    assert cold["dispatch"] == {"1": ["1"], str(PROMPT): ["[1,8]"]}, cold
    assert cold["uncompiled_runs"] == 0
    # Each of generate's Dynamo graphs (prefill, first decode, later decode:
    # the KV length is a varying dim, so no graph per length) is captured
    # ahead of time, and no call falls back to Dynamo.
    assert cold["graphs"] == 3 and cold["start"] == "aot-capture", cold
    assert cold["aot_saves"] == 3 and cold["aot_fallbacks"] == 0, cold

    warm = _generate(cache)
    # A warm start loads the three entries and Dynamo traces nothing.
    assert warm["start"] == "aot-load", warm
    assert warm["aot_loads"] == 3 and warm["aot_fallbacks"] == 0, warm
    assert warm["tokens_equal_eager"] is True
    assert warm["inductor_compiles"] == 0 and warm["corrupt"] == 0, warm
    assert warm["cache_hits"] == cold["entries_built"], warm
    assert warm["dispatch"] == cold["dispatch"] and warm["uncompiled_runs"] == 0

    # Another prompt length is served by the same three entries: the token
    # dim is dynamic in the captured prefill, so nothing is traced or built.
    other = _generate(cache, prompt=4)
    assert other["tokens_equal_eager"] is True
    assert other["start"] == "aot-load" and other["aot_loads"] == 3, other
    assert other["aot_fallbacks"] == 0 and other["inductor_compiles"] == 0, other
    assert other["dispatch"] == {"1": ["1"], "4": ["[1,8]"]}, other
