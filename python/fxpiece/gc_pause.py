"""Cyclic garbage collection paused while fxpiece makes many long-lived
objects at once: importing torch's compiler stack and loading an
ahead-of-time entry (fake tensors, FX nodes, Dynamo's guards).

None of those objects is garbage, yet each full collection they trigger
walks the whole heap, the model's modules and torch's included. Measured
on a warm start (toy Llama, 4 layers, hidden 256): the lazy import of the
compiler stack 1.22 s -> 0.95 s; on the 8-layer, hidden-1024 one,
unpickling the entry's graph 0.25 s -> 0.08 s. The collections skipped are
not all saved: one full collection runs soon after, at the next threshold.

>>> import gc
>>> with paused():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["paused"]


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside the block; afterwards it is on again if
    it was on before (a caller that turned it off keeps it off)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
