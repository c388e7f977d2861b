"""Check before create, verify before use (issue 23 item 8).

Every folder under the cache root is trust-checked before anything is
created in it: a symlink out of the root in place of ``models/``,
``locks/``, ``locks/slots`` (or a level of the host's slot folder in
``/dev/shm``) is refused and nothing is created at its target. An
ahead-of-time entry is verified before any module it names is looked up
(finding ``pkg.mod`` imports ``pkg``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PyRunner, make_toy, token_ids

import fxpiece
from fxpiece.cache.slots import CompileSlots
from fxpiece.piecewise.compilers import EagerCompiler
from fxpiece.toy_llama import ATTENTION_OP


def _cache_with_link(tmp_path: Path, rel: str) -> tuple[Path, Path]:
    """A cache root whose ``rel`` is a symlink to an empty folder outside it."""
    root = tmp_path / "cache"
    (root / rel).parent.mkdir(mode=0o700, parents=True)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (root / rel).symlink_to(outside)
    return root, outside


def _untouched(outside: Path) -> tuple[list[str], int, int]:
    """What is in ``outside`` and its mtime and ctime (a file created and
    removed again still changes them)."""
    st = os.stat(outside)
    return sorted(os.listdir(outside)), st.st_mtime_ns, st.st_ctime_ns


def _compile_and_run(root: Path, **kw: Any) -> None:
    model = make_toy(1)
    cfg = fxpiece.CompileConfig(
        compiler=kw.pop("compiler", "eager"),
        cache_dir=str(root),
        splitting_ops=[ATTENTION_OP],
        max_num_tokens=32,
        **kw,
    )
    cm = fxpiece.compile(model, cfg)
    with torch.no_grad():
        cm(token_ids(5))


def _raised(excinfo: pytest.ExceptionInfo[BaseException]) -> list[BaseException]:
    """The exception and everything it was raised from (Dynamo wraps)."""
    chain: list[BaseException] = []
    e: BaseException | None = excinfo.value
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


@pytest.mark.parametrize("aot", [True, False], ids=["launch-folder", "model-folder"])
def test_symlinked_models_folder_is_refused_before_anything_is_created(
    tmp_path: Path, aot: bool
) -> None:
    root, outside = _cache_with_link(tmp_path, "models")
    with pytest.raises(fxpiece.UntrustedCacheError, match="symlink") as ei:
        _compile_and_run(root, aot=aot)
    assert ei.value.filename == str(root / "models"), ei.value
    assert "rm " in str(ei.value), "the message says the fix"
    assert os.listdir(outside) == [], "nothing was created at the symlink's target"


def test_symlinked_slots_folder_is_refused_and_no_slot_is_written_there(
    tmp_path: Path,
) -> None:
    root, outside = _cache_with_link(tmp_path, "locks/slots")
    with pytest.raises(fxpiece.UntrustedCacheError, match="symlink") as ei:
        _compile_and_run(root, aot=False, max_parallel_compiles=1)
    assert ei.value.filename == str(root / "locks" / "slots"), ei.value
    assert os.listdir(outside) == [], "no slot folder or slot lease at the target"


@pytest.mark.parametrize("level", ["slots", "slots/host"])
def test_compile_slots_check_each_level_below_their_base(tmp_path: Path, level: str) -> None:
    """Whatever a symlink under the base leads to (here a folder of ours,
    0700, that would pass every check on its own), no slot is written there:
    the cache root's ``locks/slots[/<host>]``, or ``/dev/shm``'s
    ``fxpiece-<uid>/compile-slots`` for :class:`fxpiece.DistributedBackend`."""
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    link = base / level
    link.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    link.symlink_to(outside)
    before = _untouched(outside)
    slots = CompileSlots(base / "slots" / "host" / "deeper", count=1, base=base)
    why = slots.prepare()
    assert why is not None and str(link) in why and "symlink" in why, why
    assert _untouched(outside) == before, "nothing was created at the symlink's target"


class _SwapsLocks(EagerCompiler):
    """Compiles like ``eager``; on its first compile, replaces ``locks/`` by
    a symlink out of the root (as if someone swapped it after the cache was
    opened and checked)."""

    name = "eager-swaps-locks"

    def __init__(self, root: Path, outside: Path) -> None:
        self.root, self.outside, self.swapped = root, outside, False

    def compile(self, graph: Any, example_inputs: Sequence[Any], entry: Any, ctx: Any) -> Any:
        if not self.swapped:
            self.swapped = True
            locks = self.root / "locks"
            locks.rename(self.root / "locks-checked")
            locks.symlink_to(self.outside)
        return super().compile(graph, example_inputs, entry, ctx)


def test_locks_folder_swapped_for_a_symlink_gets_no_lease(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    before = _untouched(outside)
    compiler = _SwapsLocks(root, outside)
    with pytest.raises(Exception) as ei:  # Dynamo may wrap it: its chain is checked
        _compile_and_run(root, aot=False, compiler=compiler, max_parallel_compiles=1)
    assert compiler.swapped, "the toy model has more than one piece to compile"
    refused = [e for e in _raised(ei) if isinstance(e, fxpiece.UntrustedCacheError)]
    assert refused and refused[0].filename == str(root / "locks"), _raised(ei)
    assert _untouched(outside) == before, "no lease was written (even briefly) at the target"


EVIL_PKG = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")
"""


@pytest.mark.parametrize("damage", ["artifact", "checksum"])
@pytest.mark.slow
def test_aot_entry_is_verified_before_its_modules_are_looked_up(
    run_py: PyRunner, tmp_path: Path, damage: str
) -> None:
    from fxpiece.cache.entries import AotKey
    from fxpiece.cache.index import CacheIndex

    root = tmp_path / "cache"
    spec = json.dumps({"root": str(root)})
    r = run_py.program("toy_eager_start", spec)
    assert r["path"] == "aot-capture", r
    # A module with an import side effect, on the path of the next start.
    marker = tmp_path / "marker"
    pkg = tmp_path / "evil" / "evilpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(EVIL_PKG.format(marker=str(marker)))
    (pkg / "sub.py").write_text("")
    # The entry names it, and fails its verification.
    (index_dir,) = root.glob("models/*/*.aot/index")
    index = CacheIndex(str(index_dir))
    value = index.get(AotKey(0).to_raw())
    value["files"] = {"evilpkg.sub": "0" * 64, **value["files"]}
    if damage == "checksum":
        value["handle"] = {**value["handle"], "blake3": "f" * 64}
    else:
        art = root / value["handle"]["artifact"]
        data = bytearray(art.read_bytes())
        data[-1] ^= 0xFF
        art.write_bytes(bytes(data))
    index.insert(AotKey(0).to_raw(), value)
    del index
    path = os.pathsep.join(p for p in (str(tmp_path / "evil"), os.environ.get("PYTHONPATH")) if p)
    r = run_py.program("toy_eager_start", spec, env={"PYTHONPATH": path})
    assert not marker.exists(), "a module named by an unverified entry was imported"
    assert not r["evil_imported"], r
    assert r["path"] == "aot-capture" and "corrupt" in r["why"], r
