"""Model factories for bench/serving_load.py (``python:bench/serving_models.py:NAME``), built in code."""

from __future__ import annotations

from typing import Any


def resnet50() -> Any:
    """torchvision's ResNet-50 with random weights (timing does not depend on the values): 25.6M parameters,
    input [batch, 3, 224, 224]."""
    import torch
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None)


def tiny_cnn() -> Any:
    """The quickstart's CNN, input [batch, 3, 32, 32]: for trying the script on a CPU."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from examples.models import tiny_cnn as module

    return module.build()
