"""Static-graph wrappers: the hook where CUDA graphs plug in on GPU.

``CompileConfig(static_graph_wrapper=factory)`` wraps every exact-size entry
of every compiled piece as ``factory(fn, piece_index, entry)``. A static
graph (a CUDA graph) replays fixed memory addresses, so its inputs must live
in buffers that never move: :class:`StaticInputBuffers` implements that copy
mode on any device. Subclass it and override :meth:`run` to capture and
replay a graph on the first and later calls.

>>> import torch
>>> from fxpiece.ranges import Range
>>> from fxpiece.wrappers import StaticInputBuffers
>>> w = StaticInputBuffers(lambda x, y: x + y, 0, Range(2, 2))
>>> w(torch.ones(2), torch.ones(2)).tolist()
[2.0, 2.0]
>>> w.copies
2
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fxpiece.ranges import Range

__all__ = ["StaticInputBuffers"]


class StaticInputBuffers:
    """Copy every non-parameter tensor input into a buffer allocated on the
    first call, and call the wrapped function with the buffers, so it always
    sees the same addresses. Parameters and buffers of the model (whose
    address is stable already) are passed through."""

    def __init__(self, fn: Callable[..., Any], piece_index: int, entry: Range) -> None:
        self.fn = fn
        self.piece_index = piece_index
        self.entry = entry
        self.buffers: dict[int, torch.Tensor] | None = None
        self.copies = 0
        """Input tensors copied so far (for inspection)."""

    @staticmethod
    def _is_static(t: torch.Tensor) -> bool:
        return isinstance(t, torch.nn.Parameter) or bool(getattr(t, "_is_param", False))

    def _allocate(self, args: tuple[Any, ...]) -> dict[int, torch.Tensor]:
        return {
            i: torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            for i, a in enumerate(args)
            if isinstance(a, torch.Tensor) and not self._is_static(a)
        }

    def run(self, *args: Any) -> Any:
        """Call the wrapped function on static inputs (capture/replay here)."""
        return self.fn(*args)

    def __call__(self, *args: Any) -> Any:
        if self.buffers is None:
            self.buffers = self._allocate(args)
        call_args = list(args)
        for i, buf in self.buffers.items():
            src = args[i]
            if src.shape != buf.shape:
                raise ValueError(
                    f"piece {self.piece_index} entry {self.entry}: input {i} has shape "
                    f"{tuple(src.shape)}, its static buffer {tuple(buf.shape)}"
                )
            buf.copy_(src)
            call_args[i] = buf
            self.copies += 1
        return self.run(*call_args)
