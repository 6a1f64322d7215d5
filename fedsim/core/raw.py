"""What a dataset loader returns, before :mod:`fedsim.core.data` shapes it for the zoo.

A module of its own so that loaders outside ``data.py`` (:mod:`fedsim.core.local_data`,
a plugin's) build one without importing the registry that imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

IMAGE = "image"
TEXT = "text"
ANY = "any"
"""The modalities (:mod:`fedsim.core.modality`); ``any``: a component that takes each."""


@dataclass(frozen=True)
class RawDataset:
    """What a loader returns: uint8-range or [0,1] arrays before shaping."""

    train_images: np.ndarray  # (N, H, W) or (N, H, W, C), values in [0, 1]
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    # Per-sample columns of the training set besides the label (a writer id), by name:
    # what Flower Datasets' partitioners may split by (partition-by = "writer").
    train_columns: Mapping[str, np.ndarray] = field(default_factory=dict)
    # Whether the test split is disjoint from the training images. Where they coincide (a
    # few shipped attack targets) the audit has no public data and no non-members.
    held_out: bool = True
    # What the arrays hold (:mod:`fedsim.core.modality`): "image", or "text" (token-id
    # windows ``(N, T + 1)``, int64, each label the example's group: a speaking role, a file).
    modality: str = IMAGE
    # The token strings by id (text only).
    vocabulary: tuple[str, ...] = ()
