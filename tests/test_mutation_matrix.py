"""The mutation matrix: what must and must not change the cache key.

A tiny model (one attention layer, hidden 32; ``tests/_matrix_model/src``)
is written to a temporary folder put on ``sys.path``: its forward calls a
helper from another file, a custom op whose kernel, fake and Inductor
decomposition live in a third file Dynamo never traces, ops registered
through ``torch.library.Library`` and the other registration APIs (each
implementation in a file of its own, ``mm_lib*.py``), and bakes a
module-level constant into the graph. Compiler ``inductor``, no split, one
range ``[1,16]``; every run is a fresh process against ONE shared cache root
(``tests/_matrix_model/driver.py``).

- MISS cases must compile (a new key) and give the output of an uncached
  compile of the same setup; ``fxpiece cache explain`` must name the factor;
  and the baseline re-run in a fresh process afterwards must compile
  nothing and give the baseline's output bitwise (no artifact was
  overwritten). To stay in budget that re-run is, where it can be, the
  first run of the next process (a mutation applied in-process), else the
  next HIT case of the same baseline (a fresh process that must load the
  baseline's very key), else a process of its own; the matrix says which.
- HIT cases must keep the key, compile nothing and give the uncached output
  (the baseline's, bitwise; for new weights, the new output).

The matrix is printed (``pytest -s`` / ``-rA``) and written to
``mutation_matrix.json`` in the test's temporary folder.

Every process runs with ``TORCHINDUCTOR_VEC_ISA_OK=1`` (Inductor's ISA
probe builds cost ~20 s per cold process, since each backend gets a fresh
private Inductor folder) and ``TORCHINDUCTOR_COMPILE_THREADS=1``: the same
for every run, so part of every key alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import TESTS_DIR

from fxpiece.toy_llama import ATTENTION_OP

pytestmark = pytest.mark.slow

MODEL_SRC = TESTS_DIR / "_matrix_model" / "src"
DRIVER = TESTS_DIR / "_matrix_model" / "driver.py"
RESULT_MARK = "FXPIECE-TEST-RESULT:"
SIZES = [4, 11]
BASE_CONFIG: dict[str, Any] = {"compiler": "inductor", "splitting_ops": [], "max_num_tokens": 16}
RUN_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",  # no stale .pyc between same-size edits
    "TORCHINDUCTOR_VEC_ISA_OK": "1",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
}

# Cases that fail because of a bug outside the files this test may fix:
# name -> reason (the case is xfail(strict=True), and left out of the counts).
KNOWN_BUGS: dict[str, str] = {}

MISS, HIT, EITHER = "miss", "hit", "hit or miss"
SHARED = "miss (new key, artifacts reused)"
"""A new key whose pieces all loaded artifacts stored under another key."""
SAME_KEY_COMPILED = "compiled under the same key"


@dataclass
class Row:
    case: str
    expected: str
    got: str = "?"
    compiles: int | None = None
    key: str = ""
    output: str = ""
    explain: str = ""
    baseline_after: str = ""
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def false_hit(self) -> bool:
        """Compiled code reused across a mutation that must change it."""
        return self.expected == MISS and self.got in (HIT, SHARED)

    @property
    def false_miss(self) -> bool:
        return self.expected == HIT and self.got in (MISS, SHARED, SAME_KEY_COMPILED)


@dataclass
class HitCase:
    """A HIT case: the baseline ``base`` run in one changed way (its own
    fresh process). Run early, it also serves as the baseline re-run owed
    by the MISS case before it (same key, no compile, same output)."""

    name: str
    base: str = "baseline"
    env: dict[str, str] | None = None
    cwd: Path | None = None
    pkg: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)
    cache: str | None = None
    """``"copied"`` or ``"moved"``: run against a copy of the cache root, or
    the root itself moved elsewhere (and back afterwards)."""
    then_new_weights: str | None = None
    """Also run, in the same process, the same model with other weight
    values (a case needing no fresh process), recorded under this name."""


class Matrix:
    """Runs the cases in order against one shared cache root."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "cache"
        self.pkg = tmp / "pkg"
        shutil.copytree(MODEL_SRC, self.pkg)
        self.rows: dict[str, Row] = {}
        self.bases: dict[str, dict[str, Any]] = {}
        self.hits: list[HitCase] = []
        """HIT cases not run yet."""
        self.n = 0
        self.pending: tuple[Row, dict[str, Any]] | None = None
        """The MISS row waiting for its baseline re-run, with that baseline."""

    # -- processes ---------------------------------------------------------
    def spec(self, base: dict[str, Any], **over: Any) -> dict[str, Any]:
        run: dict[str, Any] = json.loads(json.dumps(base["spec"]))
        run["config"].update(over.pop("config", {}))
        run.update(over)
        return run

    def run(
        self,
        runs: list[dict[str, Any]],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        pkg: Path | None = None,
    ) -> list[dict[str, Any]]:
        self.n += 1
        spec_file = self.tmp / f"spec-{self.n}.json"
        spec_file.write_text(json.dumps({"pkg": str(pkg or self.pkg), "runs": runs}))
        full_env = {**os.environ, **RUN_ENV, **(env or {})}
        proc = subprocess.run(
            [sys.executable, str(DRIVER), str(spec_file)],
            env=full_env,
            cwd=str(cwd or self.tmp),
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"driver failed (rc={proc.returncode}): {proc.stderr[-3000:]}")
        result: list[dict[str, Any]] = json.loads(lines[-1][len(RESULT_MARK) :])
        return result

    def explain(self, a: str, b: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "fxpiece", "cache", "explain", a, b],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return proc.stdout + proc.stderr

    # -- baselines ---------------------------------------------------------
    def make_base(self, name: str, **over: Any) -> dict[str, Any]:
        """Compile a baseline cold (and uncached, to compare)."""
        out = self.tmp / f"{name.replace(' ', '-')}.pt"
        spec: dict[str, Any] = {
            "label": name,
            "config": {**BASE_CONFIG, "cache_dir": str(self.root)},
            "sizes": SIZES,
            **over,
        }
        [r] = self.run([{**spec, "out": str(out), "uncached": True}])
        compiles = r["diff"].get("num_inductor_compiles", 0)
        vs = r["vs_uncached"]
        assert compiles >= 1 and vs["equal"] and not r["nan"], r
        base = {"name": name, "spec": spec, "key": r["key"], "folder": r["folder"], "out": out}
        self.bases[name] = base
        return base

    def base_check_run(self, base: dict[str, Any]) -> dict[str, Any]:
        return self.spec(base, label=f"{base['name']} again", expect_out=str(base["out"]))

    def settle(self, result: dict[str, Any] | None = None, via: str = "") -> None:
        """Record the baseline re-run owed to the pending MISS row: ``result``
        (the first run of an in-process case), else the next HIT case of
        that baseline (a fresh process running the baseline's key), else a
        fresh process running the baseline unchanged."""
        if self.pending is None:
            return
        row, base = self.pending
        self.pending = None
        try:
            if result is None:
                hit = next((h for h in self.hits if h.base == base["name"]), None)
                if hit is not None:
                    result, via = self.run_hit(hit), f" (run of {hit.name!r})"
                else:
                    [result] = self.run([self.base_check_run(base)])
            if result is None:
                raise RuntimeError("the run failed")
            compiles = result["diff"].get("num_inductor_compiles", 0)
            same = result["vs_expected"]["equal"] and result["key"] == base["key"]
            eq = "=" if same else "!="
            row.baseline_after = f"{compiles} compiles, {eq} baseline{via}"
            if compiles or not same:
                row.problems.append(f"baseline re-run after it: {row.baseline_after}")
        except Exception as e:
            row.baseline_after = "failed"
            row.problems.append(f"baseline re-run failed: {e}")

    # -- cases -------------------------------------------------------------
    def miss(
        self,
        name: str,
        base: dict[str, Any],
        mutated: dict[str, Any],
        explain: str,
        *,
        expected: str = MISS,
        inproc: bool = False,
        env: dict[str, str] | None = None,
        edit: tuple[str, str, str] | None = None,
    ) -> None:
        """A case that must miss. ``inproc``: the mutation is applied inside
        the process, which first re-runs the baseline owed by the case
        before. ``edit``: ``(file, old, new)`` edited in place for the run."""
        absorb = inproc and self.pending is not None
        if not absorb:
            self.settle()
        row = self.rows[name] = Row(name, expected)
        t0 = time.perf_counter()
        try:
            runs = [{**mutated, "label": name, "uncached": True}]
            if absorb and self.pending is not None:
                runs.insert(0, self.base_check_run(self.pending[1]))
            with self._edited(edit):
                results = self.run(runs, env=env)
            if len(results) == 2:
                self.settle(results[0], " (next process, first run)")
            r = results[-1]
            self._fill(row, r, base)
            vs = r["vs_uncached"]
            row.output = _describe_output(vs, "uncached")
            if not vs["equal"] or vs["nan"] or r["nan"]:
                row.problems.append(f"output: {row.output}")
            if row.key == "new":
                text = self.explain(base["folder"], r["folder"])
                lines = text.strip().splitlines()
                row.explain = lines[2] if len(lines) > 2 else text.strip()
                if explain not in text:
                    row.problems.append(f"explain does not name {explain!r}: {text.strip()}")
            if expected == MISS and row.got != MISS:
                row.problems.append(f"expected a miss that compiles, got {row.got}")
        except Exception as e:
            row.problems.append(f"error: {e}")
            self.settle()  # still owed if the process failed before its first run
        self.pending = (row, base)
        row.seconds = time.perf_counter() - t0

    def run_hit(self, h: HitCase) -> dict[str, Any] | None:
        """Run HIT case ``h`` (taking it off the queue) and record its row;
        its result, or ``None`` if the process failed."""
        self.hits.remove(h)
        base = self.bases[h.base]
        t0 = time.perf_counter()
        names = [h.name] + ([h.then_new_weights] if h.then_new_weights else [])
        config = dict(h.config)
        try:
            with contextlib.ExitStack() as stack:
                if h.cache == "copied":
                    copied = self.tmp / "copied" / "cache"
                    shutil.copytree(self.root, copied, symlinks=True)
                    config["cache_dir"] = str(copied)
                elif h.cache == "moved":
                    moved = _mkdir(self.tmp / "moved") / "cache"
                    os.rename(self.root, moved)
                    stack.callback(os.rename, moved, self.root)
                    config["cache_dir"] = str(moved)
                expect = str(base["out"])
                runs = [self.spec(base, label=h.name, expect_out=expect, config=config)]
                if h.then_new_weights:
                    runs.append(
                        self.spec(base, label=names[1], seed=1, uncached=True, expect_out=expect)
                    )
                results = self.run(runs, env=h.env, cwd=h.cwd, pkg=h.pkg)
        except Exception as e:
            for name in names:
                self.rows[name] = Row(name, HIT, got="error", problems=[f"error: {e}"])
            return None
        for name, r in zip(names, results, strict=True):
            self._record_hit(name, base, r, time.perf_counter() - t0)
        return results[0]

    def _record_hit(self, name: str, base: dict[str, Any], r: dict[str, Any], s: float) -> None:
        row = self.rows[name] = Row(name, HIT, seconds=s)
        self._fill(row, r, base)
        if "vs_uncached" in r:  # new weights: their own uncached output
            vs = r["vs_uncached"]
            row.output = _describe_output(vs, "uncached")
            if r["vs_expected"]["equal"]:
                row.problems.append("new weights gave the old weights' output")
                row.output += " (= old weights' output!)"
        else:
            vs = r["vs_expected"]
            row.output = _describe_output(vs, "baseline")
        if not vs["equal"] or vs["nan"] or r["nan"]:
            row.problems.append(f"output: {row.output}")
        if row.got != HIT:
            row.problems.append(f"expected a hit, got {row.got}")

    @staticmethod
    def _fill(row: Row, r: dict[str, Any], base: dict[str, Any]) -> None:
        row.compiles = r["diff"].get("num_inductor_compiles", 0)
        same_key = r["key"] == base["key"]
        row.key = "same" if same_key else "new"
        if same_key and row.compiles == 0:
            row.got = HIT
        elif same_key:
            row.got = SAME_KEY_COMPILED
        elif row.compiles:
            row.got = MISS
        else:
            row.got = SHARED
        if r.get("cache_problem"):
            row.problems.append(f"cache unusable: {r['cache_problem']}")

    @contextlib.contextmanager
    def _edited(self, edit: tuple[str, str, str] | None) -> Iterator[None]:
        if edit is None:
            yield
            return
        name, old, new = edit
        path = self.pkg / name
        original = path.read_bytes()
        text = original.decode()
        assert text.count(old) == 1, (name, old)
        path.write_text(text.replace(old, new))
        try:
            yield
        finally:
            path.write_bytes(original)


def _describe_output(vs: dict[str, Any], what: str) -> str:
    if vs["nan"]:
        return f"NaN (vs {what})"
    if vs["equal"]:
        return f"= {what} (bitwise)"
    return f"!= {what} (max diff {vs['max_diff']:.3g})"


LIBRARY_EDITS: dict[str, tuple[str, str, str]] = {
    "Library.impl CompositeImplicitAutograd": (
        "mm_lib_cia.py",
        "CIA_GAIN = 1.25",
        "CIA_GAIN = 1.5",
    ),
    "Library.impl CPU": ("mm_lib_cpu.py", "DEV_SHIFT = 0.125", "DEV_SHIFT = 0.375"),
    "Library.impl Meta": (
        "mm_lib_meta.py",
        "return torch.empty_like(x)",
        "return torch.empty_like(x, memory_format=torch.contiguous_format)",
    ),
    "torch.library.register_kernel": ("mm_lib_kernel.py", "x - 0.0625", "x - 0.1875"),
    "register_fake on a Library op": (
        "mm_lib_fake.py",
        "def rk_fake(x: torch.Tensor) -> torch.Tensor:\n    return torch.empty_like(x)",
        "def rk_fake(x: torch.Tensor) -> torch.Tensor:\n    return x.new_empty(x.shape)",
    ),
    "torch.library.impl_abstract": (
        "mm_lib_abstract.py",
        "return torch.empty_like(x)",
        "return x.new_empty(x.shape)",
    ),
    "torch.library.register_autograd": ("mm_lib_autograd.py", "return grad", "return grad * 1.0"),
    "torch.library.define + impl": ("mm_lib_define.py", "TD_GAIN = 2.0", "TD_GAIN = 3.0"),
}
"""Registration API -> (the file holding its implementation, body edit)."""


def run_matrix(m: Matrix) -> None:
    t = m.tmp
    # HIT cases, in the order they run; the first ones of each baseline also
    # serve as the baseline re-run after a MISS case in a fresh process.
    other_path = t / "elsewhere" / "pkg-copy"
    m.hits = [
        HitCase("HOME", env={"HOME": str(_mkdir(t / "home"))}),
        HitCase("TMPDIR", env={"TMPDIR": str(_mkdir(t / "tmpdir"))}),
        HitCase("MASTER_PORT", env={"MASTER_PORT": "29517"}),
        HitCase("RANK", env={"RANK": "3"}),
        HitCase("LOCAL_RANK", env={"LOCAL_RANK": "1"}),
        HitCase("WORLD_SIZE", env={"WORLD_SIZE": "4"}),
        HitCase("PYTHONHASHSEED", env={"PYTHONHASHSEED": "123"}),
        HitCase("unrelated variable", env={"FXPIECE_MATRIX_UNRELATED": "x" * 40}),
        # Only how long a lock is waited for (issue 24).
        HitCase("TORCHINDUCTOR_FILE_LOCK_TIMEOUT", env={"TORCHINDUCTOR_FILE_LOCK_TIMEOUT": "1234"}),
        HitCase("cwd", cwd=_mkdir(t / "cwd")),
        HitCase("copied cache folder", cache="copied"),
        HitCase("moved cache folder", cache="moved"),
        # Against the pass baseline, so pass sources are checked too.
        HitCase("model files at another path", base="pass baseline", pkg=other_path),
        HitCase(
            "lock_timeout/lease_ttl",
            base="pass baseline",
            config={"lock_timeout": 5.0, "lease_ttl": 7.0},
            then_new_weights="new weight values",
        ),
    ]
    base = m.make_base("baseline")
    # MISS: fresh-process mutations (files, environment) alternate with
    # in-process ones, whose process re-runs the baseline first.
    m.miss(
        "model source edit",
        base,
        m.spec(base),
        "traced file changed: mm_model.py",
        edit=("mm_model.py", "h = x + self.o(a) * SCALE", "h = x - self.o(a) * SCALE"),
    )
    m.miss("weight shape", base, m.spec(base, hidden=48), "graph: ", inproc=True)
    m.miss(
        "helper in another file",
        base,
        m.spec(base),
        "traced file changed: mm_helper.py",
        edit=("mm_helper.py", "GAIN = 0.5", "GAIN = 0.75"),
    )
    m.miss("dtype bf16", base, m.spec(base, dtype="bfloat16"), "graph: ", inproc=True)
    m.miss(
        "custom op impl (untraced file)",
        base,
        m.spec(base),
        "op implementation file changed: mm_op.py",
        edit=("mm_op.py", "SHIFT = 0.25", "SHIFT = 0.75"),
    )
    m.miss(
        "splitting ops",
        base,
        m.spec(base, config={"splitting_ops": [ATTENTION_OP]}),
        "config.splitting_ops",
        inproc=True,
    )
    m.miss(
        "TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE",
        base,
        m.spec(base),
        "inductor.cpp.min_chunk_size",
        env={"TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE": "1"},
    )
    m.miss(
        "ranges/sizes",
        base,
        m.spec(base, config={"compile_sizes": [4]}),
        "config.compile_entries",
        inproc=True,
    )
    m.miss(
        "ATEN_CPU_CAPABILITY=avx2",
        base,
        m.spec(base),
        "env ATEN_CPU_CAPABILITY",
        env={"ATEN_CPU_CAPABILITY": "avx2"},
    )
    m.miss(
        "CompileConfig.inductor_config",
        base,
        m.spec(base, config={"inductor_config": {"epilogue_fusion": False}}),
        "config.inductor_config.epilogue_fusion",
        inproc=True,
    )
    m.miss(
        "comment-only edit",
        base,
        m.spec(base),
        "traced file changed: mm_model.py",
        expected=EITHER,
        edit=(
            "mm_model.py",
            "        t = x.shape[0]\n",
            "        # a comment\n        t = x.shape[0]\n",
        ),
    )
    m.miss(
        "torch._inductor.config global",
        base,
        m.spec(base, inductor_global={"cpp.simdlen": 256}),
        "inductor.cpp.simdlen",
        inproc=True,
    )
    m.miss("Python constant in graph", base, m.spec(base, scale=2.5), "graph: ", inproc=True)
    m.miss(
        "torch.set_num_threads(1)",
        base,
        m.spec(base, threads=1),
        "compiler.runtime.threads",
        inproc=True,
    )
    # Ops registered through torch.library.Library and friends (not
    # custom_op): each API's implementation in its own untraced file.
    for case, (file, before, after) in LIBRARY_EDITS.items():
        m.miss(
            case,
            base,
            m.spec(base),
            f"op implementation file changed: {file}",
            edit=(file, before, after),
        )
    m.settle()

    # The pass cases, against a baseline with the pass.
    shutil.copytree(m.pkg, other_path)
    pbase = m.make_base("pass baseline", pass_tag="a")
    m.miss(
        "custom pass source",
        pbase,
        m.spec(pbase),
        "config.post_grad_passes",
        edit=("mm_pass.py", "graph.lint()", "graph.lint()\n            graph.lint()"),
    )
    m.miss(
        "custom pass options",
        pbase,
        m.spec(pbase, pass_tag="b"),
        "config.post_grad_passes",
        inproc=True,
    )
    m.miss(
        "pass helper constant (other module)",
        pbase,
        m.spec(pbase),
        "config.post_grad_passes",
        edit=("mm_passconst.py", "PASS_LIMIT = 1", "PASS_LIMIT = 2"),
    )
    m.settle()
    while m.hits:
        m.run_hit(m.hits[0])


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def format_matrix(rows: list[Row]) -> str:
    head = (
        "case",
        "expected",
        "got",
        "compiles",
        "key",
        "output",
        "s",
        "explain",
        "baseline after",
    )
    table = [head] + [
        (
            r.case,
            r.expected,
            r.got,
            "-" if r.compiles is None else str(r.compiles),
            r.key,
            r.output,
            f"{r.seconds:.0f}",
            r.explain[:80],
            r.baseline_after,
        )
        for r in rows
    ]
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)) for t in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in rows:
        for p in r.problems:
            lines.append(f"PROBLEM {r.case}: {p}")
    return "\n".join(lines)


def counts(rows: list[Row]) -> dict[str, int]:
    return {
        "cases": len(rows),
        "miss_expected": sum(r.expected == MISS for r in rows),
        "hit_expected": sum(r.expected == HIT for r in rows),
        "false_hits": sum(r.false_hit for r in rows),
        "false_misses": sum(r.false_miss for r in rows),
        "with_problems": sum(bool(r.problems) for r in rows),
    }


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Row]:
    tmp = tmp_path_factory.mktemp("matrix")
    m = Matrix(tmp)
    t0 = time.perf_counter()
    run_matrix(m)
    wall = time.perf_counter() - t0
    rows = list(m.rows.values())
    c = counts(rows)
    report = tmp / "mutation_matrix.json"
    report.write_text(
        json.dumps({"counts": c, "wall_s": wall, "rows": [asdict(r) for r in rows]}, indent=1)
    )
    print(f"\nmutation matrix ({m.n} processes, {wall:.0f} s; {report}):")
    print(format_matrix(rows))
    print("counts:", json.dumps(c))
    return m.rows


CASES = [
    "model source edit",
    "helper in another file",
    "Python constant in graph",
    "weight shape",
    "dtype bf16",
    "splitting ops",
    "ranges/sizes",
    "CompileConfig.inductor_config",
    "torch._inductor.config global",
    "TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE",
    "custom pass source",
    "custom pass options",
    "pass helper constant (other module)",
    "ATEN_CPU_CAPABILITY=avx2",
    "custom op impl (untraced file)",
    "torch.set_num_threads(1)",
    "comment-only edit",
    "HOME",
    "cwd",
    "TMPDIR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "PYTHONHASHSEED",
    "unrelated variable",
    "TORCHINDUCTOR_FILE_LOCK_TIMEOUT",
    *LIBRARY_EDITS,
    "moved cache folder",
    "copied cache folder",
    "model files at another path",
    "new weight values",
    "lock_timeout/lease_ttl",
]


def _param(name: str) -> Any:
    if name in KNOWN_BUGS:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[name]))
    return name


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_mutation(matrix: dict[str, Row], case: str) -> None:
    row = matrix[case]
    assert not row.problems, f"{case}: {row.problems}"


def test_matrix_counts(matrix: dict[str, Row]) -> None:
    assert sorted(matrix) == sorted(CASES)
    rows = [r for r in matrix.values() if r.case not in KNOWN_BUGS]
    c = counts(rows)
    assert c["false_hits"] == 0 and c["false_misses"] == 0, format_matrix(rows)
