"""A user's model file for tests/test_backend.py's
``test_key_follows_traced_source_files``: the test copies this source to a
file of its own, edits it (the ``LINE-A``/``LINE-B`` lines) and imports it,
to see the cache key follow the traced source files."""

import torch

import fxpiece.toy_llama  # noqa: F401  (registers fxpiece_toy::attention)


class KeyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)  # LINE-A
        h = h.view(x.shape[0], 2, 8)
        a: torch.Tensor = torch.ops.fxpiece_toy.attention(h, h, h)
        return a * 2  # LINE-B
