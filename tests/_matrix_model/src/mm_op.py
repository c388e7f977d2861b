"""A custom op whose implementation Dynamo never traces: its kernel, fake
and Inductor decomposition (which Inductor inlines into compiled code)."""

import torch
from torch._inductor.decomposition import register_decomposition

SHIFT = 0.25


@torch.library.custom_op("mmx::shift", mutates_args=())
def shift(x: torch.Tensor) -> torch.Tensor:
    return x + SHIFT


@shift.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@register_decomposition(torch.ops.mmx.shift.default)
def _shift_decomp(x: torch.Tensor) -> torch.Tensor:
    return x + SHIFT
