"""Compilation counters.

``fxpiece.counters`` is the process-wide instance; every :class:`Backend`
also keeps its own in ``backend.stats.counters``.

>>> from fxpiece.counters import Counters
>>> c = Counters()
>>> with c.expect(num_graphs_seen=1):
...     c.add("num_graphs_seen")
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["COUNTER_NAMES", "Counters", "counters"]

COUNTER_NAMES = (
    "num_graphs_seen",
    "num_piecewise_graphs_seen",
    "num_piecewise_capturable_graphs_seen",
    "num_backend_compilations",
    "num_inductor_compiles",
    "num_eager_compiles",
    "num_cache_hits",
    "num_cache_misses",
    "num_cache_entries_updated",
    "num_compiled_artifacts_saved",
    "num_cache_waits",
    "num_uncompiled_runs",
    "num_corrupt_artifacts",
    "num_aot_saves",
    "num_aot_loads",
    "num_aot_fallbacks",
    "num_remote_hits",
    "num_remote_pushes",
    "num_untrusted_remote",
    "num_remote_errors",
)


class Counters:
    """Named integer counters; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(COUNTER_NAMES, 0)

    def add(self, name: str, n: int = 1) -> None:
        if name not in self._values:
            raise KeyError(f"unknown counter {name!r}; known: {', '.join(COUNTER_NAMES)}")
        with self._lock:
            self._values[name] += n

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def __getattr__(self, name: str) -> int:
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            return int(values[name])
        raise AttributeError(name)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    def __repr__(self) -> str:
        nonzero = {k: v for k, v in self.snapshot().items() if v}
        return f"Counters({nonzero})"

    @contextlib.contextmanager
    def expect(self, **diffs: int) -> Iterator[None]:
        """Assert, on leaving the block, that each named counter grew by
        exactly the given amount. Raises ``AssertionError`` listing every
        mismatch."""
        unknown = sorted(set(diffs) - set(self._values))
        if unknown:
            raise KeyError(f"unknown counters {unknown}; known: {', '.join(COUNTER_NAMES)}")
        before = self.snapshot()
        yield
        after = self.snapshot()
        wrong = {
            name: (want, after[name] - before[name])
            for name, want in diffs.items()
            if after[name] - before[name] != want
        }
        if wrong:
            lines = [f"{n}: expected +{w}, got +{g}" for n, (w, g) in sorted(wrong.items())]
            raise AssertionError("counter differences do not match: " + "; ".join(lines))


counters = Counters()
