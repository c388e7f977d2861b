"""mml::cia's CompositeImplicitAutograd implementation (Library.impl):
decomposed at trace time, so it is inlined into compiled code."""

import torch

CIA_GAIN = 1.25


def cia_impl(x: torch.Tensor) -> torch.Tensor:
    return x * CIA_GAIN
