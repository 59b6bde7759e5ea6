"""The tiny CNN with more work by whole layers, for gates that must see a known slowdown
(`bench/reproducibility.py gate` and `gated`).

- ``cnn`` / ``cnn_more_work``: the tiny CNN of ``tiny_cnn.py``, and the same with three more 3x3 convolutions
  (64 channels, 8x8) after its last stage; ``cnn_one_more_layer`` / ``cnn_two_more_layers``: one or two of them.
  How much slower depends on how busy the host is (a busy host's fixed costs per call dilute the work): on one
  ONNX Runtime thread at batch 8, on an idle 2-core host, one more layer 1.15x (range 1.05-1.21), two 1.31x
  (1.14-1.39), three 1.50x (1.37-1.63), medians of 12 interleaved A/B windows; on a host loaded far beyond one
  neighbour, three were 1.24-1.28x.

Weights come from a fixed seed, so every export is identical. (``mlp_layers.py``: the same for GPUs.)
"""

from __future__ import annotations

import torch
from tiny_cnn import TinyCNN  # beside this file (a recipe's python: file finds its helper modules)
from tiny_cnn import build as tiny_cnn
from torch import nn


class _MoreWork(nn.Module):
    def __init__(self, base: TinyCNN, extra: int) -> None:
        super().__init__()
        self.base = base
        width = base.fc.in_features
        self.extra = nn.Sequential(*[nn.Sequential(nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                                   nn.ReLU()) for _ in range(extra)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.base
        x = self.extra(b.layer3(b.layer2(b.layer1(b.stem(x)))))
        return b.fc(torch.flatten(b.pool(x), 1))


def cnn() -> nn.Module:
    return tiny_cnn()


def cnn_more_work() -> nn.Module:
    base = tiny_cnn()
    torch.manual_seed(1)
    return _MoreWork(base, extra=3).eval()


def cnn_one_more_layer() -> nn.Module:
    base = tiny_cnn()
    torch.manual_seed(1)
    return _MoreWork(base, extra=1).eval()


def cnn_two_more_layers() -> nn.Module:
    base = tiny_cnn()
    torch.manual_seed(1)
    return _MoreWork(base, extra=2).eval()
