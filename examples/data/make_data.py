"""Regenerate the small calibration/validation sets shipped with the examples (deterministic).

cnn_calib.npz:     'input'     float32 [32, 3, 32, 32]  smooth synthetic images, normalised like ImageNet
encoder_calib.npz: 'input_ids' int64   [32, 32]         token ids with a Zipf-like distribution

    python examples/data/make_data.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def smooth_images(count: int, rng: np.random.Generator) -> np.ndarray:
    coarse = rng.normal(0.0, 1.0, size=(count, 3, 4, 4)).astype(np.float32)
    images = coarse.repeat(8, axis=2).repeat(8, axis=3)  # blocky low-frequency structure
    images += rng.normal(0.0, 0.25, size=images.shape).astype(np.float32)  # texture
    return images.astype(np.float32)


def token_ids(count: int, length: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    ranks = rng.zipf(1.3, size=(count, length))
    return np.clip(ranks, 1, vocab - 1).astype(np.int64)


def main() -> None:
    here = Path(__file__).parent
    rng = np.random.default_rng(2026)
    np.savez_compressed(here / "cnn_calib.npz", input=smooth_images(32, rng))
    np.savez_compressed(here / "encoder_calib.npz", input_ids=token_ids(32, 32, 1000, rng))


if __name__ == "__main__":
    main()
