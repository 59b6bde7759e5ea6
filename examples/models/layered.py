"""Models whose work grows by whole layers, for gates that must see a known slowdown (`bench/gate_power.py`,
`bench/reproducibility.py gated`).

- ``cnn`` / ``cnn_more_work``: the tiny CNN of ``tiny_cnn.py``, and the same with three more 3x3 convolutions
  (64 channels, 8x8) after its last stage: on one ONNX Runtime thread at batch 8 about 20% slower (each one adds
  about 6.5%, measured A/B);
- ``mlp10`` / ``mlp11``: a 10- and an 11-layer MLP (1024 wide): 10% more work, for GPUs.

Weights come from a fixed seed, so every export is identical.
"""

from __future__ import annotations

import torch
from torch import nn

from examples.models.tiny_cnn import TinyCNN, build as tiny_cnn


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


def _mlp(layers: int, width: int = 1024) -> nn.Module:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks).eval()


def mlp10() -> nn.Module:
    return _mlp(10)


def mlp11() -> nn.Module:
    return _mlp(11)
