"""MLPs of 10 and 11 layers (1024 wide): 10% more work, for gates on a GPU that must see a known slowdown
(`bench/gpu_gate.py`). Self-contained (a pinned copy of this file runs on its own); weights from a fixed seed."""

from __future__ import annotations

import torch
from torch import nn


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
