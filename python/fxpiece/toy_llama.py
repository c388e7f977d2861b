"""A tiny Llama-style model for the demo, tests and benchmarks.

Attention is the custom op ``fxpiece_toy::attention`` (registered with
``torch.library``), the split op of the demo, as in inference engines. With
``sdpa=True`` it calls ``torch.nn.functional.scaled_dot_product_attention``
directly instead, like Hugging Face models, to show splitting at a callable.

>>> import torch
>>> from fxpiece.toy_llama import ToyLlama, ToyLlamaConfig
>>> m = ToyLlama(ToyLlamaConfig(num_layers=2))
>>> m(torch.arange(5)).shape
torch.Size([5, 64])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ATTENTION_OP", "ToyLlama", "ToyLlamaConfig", "attention"]

ATTENTION_OP = "fxpiece_toy::attention"


@torch.library.custom_op(ATTENTION_OP, mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal self-attention over the tokens of one sequence.

    q, k, v: ``[tokens, heads, head_dim]``; returns ``[tokens, heads * head_dim]``.
    """
    t, h, d = q.shape
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )
    return out.transpose(0, 1).reshape(t, h * d).contiguous()


@attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    t, h, d = q.shape
    return q.new_empty((t, h * d))


@dataclass(frozen=True)
class ToyLlamaConfig:
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    sdpa: bool = False
    """Call F.scaled_dot_product_attention directly instead of the custom op."""
    seed: int = 0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out: torch.Tensor = (y * self.weight.float()).to(x.dtype)
        return out


class Layer(nn.Module):
    def __init__(self, cfg: ToyLlamaConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.heads = cfg.num_heads
        self.sdpa = cfg.sdpa
        self.norm1 = RMSNorm(h)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.norm2 = RMSNorm(h)
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).view(t, 3, self.heads, -1).unbind(1)
        if self.sdpa:
            a = F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
            )
            a = a.transpose(0, 1).reshape(t, -1)
        else:
            a = torch.ops.fxpiece_toy.attention(q, k, v)
        x = x + self.o(a)
        g, u = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        out: torch.Tensor = x + self.down(F.silu(g) * u)
        return out


class ToyLlama(nn.Module):
    """Token ids ``[tokens]`` to final hidden states ``[tokens, hidden]``."""

    def __init__(self, cfg: ToyLlamaConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or ToyLlamaConfig()
        gen = torch.Generator().manual_seed(cfg.seed)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() > 1:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.norm(x)
        return out
