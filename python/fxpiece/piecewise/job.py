"""What :meth:`Backend.build <fxpiece.piecewise.backend.Backend.build>`
builds: one Dynamo graph and everything known about it, as one value.

Three callers make one: Dynamo calling the backend (the facts come from
Dynamo's tracing context: :meth:`GraphJob.from_dynamo`), an ahead-of-time
capture, and a warm start that loaded a saved graph (the facts come from
the saved entry: :meth:`Piecewise.build
<fxpiece.piecewise._torch_compat.aot.Piecewise.build>`). Nothing reaches the
backend through a context variable.

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
>>> job = GraphJob(gm, [torch.ones(2)], traced=(), marked=())
>>> job.saved is None and job.full_graph is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

__all__ = ["FullGraph", "GraphJob"]

FullGraph = Callable[[], torch.fx.GraphModule]
"""Loads a saved graph with every node's recorded value (on demand)."""


@dataclass(frozen=True)
class GraphJob:
    """One graph to split, plan, load or compile, and stitch."""

    gm: torch.fx.GraphModule
    """Dynamo's graph (on a warm start possibly the light one: see ``full_graph``)."""
    example_inputs: Sequence[Any]
    """Its inputs: real tensors or fakes (only their metadata is read)."""
    traced: Sequence[str]
    """The source files Dynamo traced for it (they enter the cache key)."""
    marked: Sequence[tuple[int, int]]
    """``(input index, dim)`` of every token dim the user marked dynamic."""
    saved: dict[str, Any] | None = None
    """The state of an ahead-of-time entry: its key factors are reused when
    they still hold, and a capture records them there."""
    full_graph: FullGraph | None = None
    """Set when ``gm`` is an entry's light graph (recorded values only at
    piece boundaries): loads the whole one, for a piece that must compile."""

    @classmethod
    def from_dynamo(cls, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> GraphJob:
        """The job of a graph Dynamo hands the backend now (inside its
        tracing context: the traced files and marked dims come from there)."""
        from fxpiece.piecewise import _torch_compat

        return cls(
            gm,
            example_inputs,
            traced=_torch_compat.traced_files(),
            marked=_torch_compat.marked_dims(gm),
        )

    def whole(self) -> GraphJob:
        """This job with the whole graph (loaded now if ``gm`` is the light one)."""
        if self.full_graph is None:
            return self
        return replace(self, gm=self.full_graph(), full_graph=None)
