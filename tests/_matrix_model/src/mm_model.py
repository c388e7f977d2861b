"""The matrix model: one attention layer (hidden 32) whose forward calls a
helper from another file, a custom op defined in a third one, ops registered
through ``torch.library.Library`` (``mm_lib``), and bakes the
module-level constant ``SCALE`` into the graph."""

import mm_lib
import mm_op  # noqa: F401  (registers mmx::shift)
import torch
from mm_helper import act

import fxpiece.toy_llama  # noqa: F401  (registers fxpiece_toy::attention)

SCALE = 1.5


class Tiny(torch.nn.Module):
    def __init__(self, hidden: int = 32, heads: int = 2, seed: int = 0) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, 3, self.heads, -1).unbind(1)
        a = torch.ops.fxpiece_toy.attention(q, k, v)
        h = x + self.o(a) * SCALE
        out: torch.Tensor = mm_lib.apply(torch.ops.mmx.shift(act(h)))
        return out
