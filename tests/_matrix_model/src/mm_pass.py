"""A post-grad pass of the matrix model; what it does depends on a constant
in another module it imports."""

import torch
from mm_passconst import PASS_LIMIT

from fxpiece.piecewise.passes import InductorPass


class MarkPass(InductorPass):
    def __init__(self, tag: str = "a") -> None:
        self.tag = tag

    def options(self) -> object:
        return {"tag": self.tag}

    def __call__(self, graph: torch.fx.Graph) -> None:
        if len(graph.nodes) > PASS_LIMIT:
            graph.lint()
