"""A helper of the matrix model, in a file of its own (Dynamo traces it)."""

import torch

GAIN = 0.5


def act(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x) * GAIN
