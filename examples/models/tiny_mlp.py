"""A two-layer MLP: the smallest real model, used by fast tests and the quickstart's unit checks."""

from __future__ import annotations

import torch
from torch import nn


def build(features: int = 16, hidden: int = 32, classes: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes)).eval()
