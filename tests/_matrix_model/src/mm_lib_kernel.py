"""mml::rk's CPU kernel, registered with torch.library.register_kernel."""

import torch


def rk_cpu(x: torch.Tensor) -> torch.Tensor:
    return x - 0.0625
