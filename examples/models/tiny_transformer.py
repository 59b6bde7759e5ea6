"""A small transformer encoder (token embedding, 2 pre-norm layers, mean-pooled classifier head).

Inputs: ``input_ids`` int64 [batch, seq]; output ``logits`` [batch, num_classes]. Attention reshapes use -1
for the sequence axis so the ONNX export stays dynamic in batch and sequence length with either exporter.
``build()`` is the recipe factory.
"""

from __future__ import annotations

import torch
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        shape = (x.shape[0], -1, self.heads, self.head_dim)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        attn = torch.softmax(q @ k.transpose(-2, -1) * self.head_dim**-0.5, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(x.shape[0], -1, self.heads * self.head_dim)
        return self.proj(out)


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyEncoder(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2,
                 num_classes: int = 4, max_len: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(1, max_len, dim) * 0.02)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.position[:, : input_ids.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


def build(vocab: int = 1000, dim: int = 64, layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return TinyEncoder(vocab=vocab, dim=dim, layers=layers).eval()
