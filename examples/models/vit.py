"""A Vision Transformer classifier in plain PyTorch (no torchvision, no downloads), sized by arguments.

``build()`` gives a ViT-B/16-sized model (224x224 images, 16x16 patches, width 768, 12 layers of 12 heads,
MLP 3072, 1000 classes: 86.6M parameters, ~346 MB as fp32 ONNX); ``build_small()`` a ViT-like model small
enough for tests. Input ``images`` float32 [batch, 3, size, size]; output ``logits`` [batch, classes].

Weights come from a fixed seed. A randomly initialised transformer has none of the structure training gives
(outlier channels, peaked attention); to make its activation statistics less uniform, LayerNorm scales
and biases are drawn around their trained-like values instead of the constant 1 / 0.
"""

from __future__ import annotations

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = torch.softmax((q * self.head_dim**-0.5) @ k.transpose(-2, -1), dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(batch, tokens, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, image_size: int = 224, patch: int = 16, dim: int = 768, depth: int = 12, heads: int = 12,
                 mlp_dim: int = 3072, num_classes: int = 1000) -> None:
        super().__init__()
        tokens = (image_size // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads, mlp_dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.position
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def _initialise(model: VisionTransformer) -> None:
    with torch.no_grad():
        nn.init.trunc_normal_(model.position, std=0.02)
        nn.init.trunc_normal_(model.cls_token, std=0.02)
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.normal_(module.bias, std=0.01)
            elif isinstance(module, nn.LayerNorm):
                module.weight.normal_(1.0, 0.2)
                module.bias.normal_(0.0, 0.05)


def build(image_size: int = 224, patch: int = 16, dim: int = 768, depth: int = 12, heads: int = 12,
          mlp_dim: int = 3072, num_classes: int = 1000) -> nn.Module:
    """A ViT; the defaults are ViT-B/16's shape."""
    torch.manual_seed(0)
    model = VisionTransformer(image_size=image_size, patch=patch, dim=dim, depth=depth, heads=heads,
                              mlp_dim=mlp_dim, num_classes=num_classes)
    _initialise(model)
    return model.eval()


def build_small() -> nn.Module:
    """A ViT-like model for tests: 32x32 images, 8x8 patches (17 tokens), width 64, 2 layers, 10 classes."""
    return build(image_size=32, patch=8, dim=64, depth=2, heads=4, mlp_dim=256, num_classes=10)


def build_half() -> nn.Module:
    """ViT-B/16 in fp16 (for a PyTorch fp16 baseline; feed it float16 inputs)."""
    return build().half()


def build_half_small() -> nn.Module:
    """`build_small` in fp16."""
    return build_small().half()


def _images(count: int, size: int) -> dict[str, object]:
    """Smooth synthetic images (blocky low-frequency structure plus texture), normalised like ImageNet."""
    import numpy as np

    rng = np.random.default_rng(2026)
    coarse = rng.normal(0.0, 1.0, size=(count, 3, size // 8, size // 8)).astype(np.float32)
    images = coarse.repeat(8, axis=2).repeat(8, axis=3)
    images += rng.normal(0.0, 0.25, size=images.shape).astype(np.float32)
    return {"images": images.astype(np.float32)}


def images() -> dict[str, object]:
    """32 calibration/validation images for `build` (224x224)."""
    return _images(32, 224)


def images_small() -> dict[str, object]:
    """32 images for `build_small` (32x32)."""
    return _images(32, 32)
