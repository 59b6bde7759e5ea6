"""A small transformer encoder (token embedding, 2 layers, pooled classifier head).

Inputs: ``input_ids`` int64 [batch, seq]; output ``logits`` [batch, num_classes]. Dynamic batch and
sequence length export cleanly. ``build()`` is the recipe factory.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyEncoder(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2,
                 num_classes: int = 4, max_len: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(1, max_len, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        x = self.embed(input_ids) + self.position[:, :seq]
        x = self.norm(self.encoder(x))
        return self.head(x.mean(dim=1))


def build(vocab: int = 1000, dim: int = 64, layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return TinyEncoder(vocab=vocab, dim=dim, layers=layers).eval()
