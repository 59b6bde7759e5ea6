"""A small BERT-like encoder: two int64 inputs, dynamic batch and sequence length, two outputs.

Inputs: ``input_ids`` int64 [batch, seq] and ``attention_mask`` int64 [batch, seq] (1 = token, 0 = padding).
Outputs: ``last_hidden_state`` float [batch, seq, dim] and ``pooled`` float [batch, dim] (tanh of a dense
layer over the first token, as BERT's pooler).

Factories (what recipes point at):

- ``build()``: attention reshapes written the way most encoders are (``view(batch, seq, heads, head_dim)``
  with the sizes read from the input), which both ONNX exporters keep dynamic.
- ``build(bake_seq=True)``: the same model, but the sequence length goes through a Python ``int``, as code
  that does arithmetic on sizes often does; the TorchScript exporter then records the sample's sequence length
  as a constant in the reshapes, so the ONNX model only runs at that length.
- ``build_torch_encoder()``: PyTorch's own ``nn.TransformerEncoder``, whose inference fast path (nested tensors
  from the padding mask) the TorchScript exporter cannot export.

Weights come from a fixed seed, so every export is identical.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class BertSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, bake_seq: bool) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.output = nn.Linear(dim, dim)
        self.bake_seq = bake_seq

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        batch, seq = x.shape[0], x.shape[1]
        if self.bake_seq:
            seq = int(seq)  # a Python int: the TorchScript tracer records its value, not the size

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask_bias
        context = torch.softmax(scores, dim=-1) @ v
        return self.output(context.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


class BertLayer(nn.Module):
    def __init__(self, dim: int, heads: int, bake_seq: bool) -> None:
        super().__init__()
        self.attention = BertSelfAttention(dim, heads, bake_seq)
        self.norm1 = nn.LayerNorm(dim, eps=1e-12)
        self.intermediate = nn.Linear(dim, dim * 4)
        self.out = nn.Linear(dim * 4, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attention(x, mask_bias))
        return self.norm2(x + self.out(nn.functional.gelu(self.intermediate(x))))


class TinyBert(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2, max_len: int = 128,
                 bake_seq: bool = False) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(max_len, dim)
        self.embedding_norm = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(dim, heads, bake_seq) for _ in range(layers))
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.embedding_norm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x, torch.tanh(self.pooler(x[:, 0]))


def build(vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2, bake_seq: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return TinyBert(vocab=vocab, dim=dim, heads=heads, layers=layers, bake_seq=bake_seq).eval()


class TorchEncoder(nn.Module):
    """Embeddings + ``nn.TransformerEncoder`` with a padding mask: the shape of many PyTorch-native encoders."""

    def __init__(self, vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=True)
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
        return hidden, torch.tanh(self.pooler(hidden[:, 0]))


def build_torch_encoder(vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return TorchEncoder(vocab=vocab, dim=dim, heads=heads, layers=layers).eval()
