"""One "host" of a fleet sharing a remote cache tier (tests/test_fleet.py,
benches/bench_fleet.py): compile the toy Llama with ``fxpiece.compile`` and
run it for each size, then report what happened.

    python -m programs.fleet_host SPEC_JSON

``spec``: ``layers``, ``config`` (CompileConfig kwargs: ``cache_dir``,
``remote_cache``...), ``sizes``, ``out`` (``torch.save`` the outputs there);
optional ``ready`` (a file touched once imports are done) and ``go`` (a file
waited for before the first call: processes started together); ``mid`` (a
file touched when the first compile is under way, then ``<mid>.go`` is
waited for: the test acts in the middle of the start; a post-grad pass that
changes nothing does it, so it enters the cache key).

Reports: counter differences of the first calls, the start path, the
fxpiece warnings, the wall time of the first calls (``first_s``) and the
backend's pieces compiled/loaded.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

import fxpiece
from programs.report import counter_diff, keep_logs, report
from programs.toy import make_toy, token_ids

WAIT_S = 300.0


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


class PauseOnce(fxpiece.InductorPass):
    """A post-grad pass that changes nothing; the first time it runs (inside
    the first compile) it touches ``mark`` and waits for ``<mark>.go``."""

    def __init__(self, mark: str) -> None:
        self.mark = Path(mark)

    def options(self) -> Any:
        return {"pause": "once"}

    def __call__(self, graph: torch.fx.Graph) -> None:
        if not self.mark.exists():
            self.mark.touch()
            _wait_for(Path(f"{self.mark}.go"))


def run(spec: dict[str, Any]) -> dict[str, Any]:
    logs = keep_logs()
    kw = dict(spec["config"])
    if spec.get("mid"):
        kw["post_grad_passes"] = [PauseOnce(spec["mid"])]
    cfg = fxpiece.CompileConfig(**kw)
    model = make_toy(spec["layers"])
    cm = fxpiece.compile(model, cfg)
    if spec.get("ready"):
        Path(spec["ready"]).touch()
    if spec.get("go"):
        _wait_for(Path(spec["go"]))
    before = fxpiece.counters.snapshot()
    t0 = time.perf_counter()
    with torch.no_grad():
        outs = {n: cm(token_ids(n)) for n in spec["sizes"]}
    first_s = time.perf_counter() - t0
    if spec.get("out"):
        torch.save(outs, spec["out"])
    graphs = cm.stats.graphs
    return {
        "diff": counter_diff(before, fxpiece.counters.snapshot()),
        "start": None if cm.start is None else cm.start.path,
        "warnings": [m for m in logs],
        "first_s": first_s,
        "compiled": sum(p.compiled for g in graphs for p in g.pieces),
        "loaded": sum(p.loaded for g in graphs for p in g.pieces),
        "key": graphs[0].cache_key if graphs else None,
    }


if __name__ == "__main__":
    report(run(json.loads(sys.argv[1])))
