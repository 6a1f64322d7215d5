"""A generated dataset (no files, no download): one bar per class on a noisy background."""

from __future__ import annotations

import numpy as np

from fedsim.core.config import DataConfig
from fedsim.core.data import DATASETS, RawDataset

CLASSES, SIDE, TRAIN, TEST = 8, 16, 320, 80


def _images(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    images = rng.uniform(0.0, 0.3, size=(len(labels), SIDE, SIDE))
    for image, label in zip(images, labels, strict=True):
        row = 1 + 2 * int(label)  # class k: a bright bar at row 2k+1, columns jittered
        start = int(rng.integers(0, SIDE // 4))
        image[row : row + 2, start : start + SIDE // 2] = 1.0
    return images.astype(np.float32)


@DATASETS.register("tinylab-bars", "8 classes of generated 16x16 bars (320 train / 80 test)")
def bars(cfg: DataConfig) -> RawDataset:
    """Generated the same every time (seed 0), so every process holds the same data."""
    rng = np.random.default_rng(0)
    train_labels = np.arange(TRAIN, dtype=np.int64) % CLASSES
    test_labels = np.arange(TEST, dtype=np.int64) % CLASSES
    train, test = _images(rng, train_labels), _images(rng, test_labels)
    return RawDataset(train, train_labels, test, test_labels, CLASSES)
