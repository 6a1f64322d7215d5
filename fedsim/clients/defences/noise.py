"""Noise and clipping on the uploaded update: ``gaussian``, ``laplace``, ``clip``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsim.clients.defences.base import (
    DEFENCES,
    Defence,
    Tensors,
    clip_to_norm,
    noise_like,
)
from fedsim.core.config import require


@dataclass(frozen=True)
class GaussianParams:
    """``sigma``: standard deviation of the noise on every uploaded coordinate."""

    sigma: float

    def __post_init__(self) -> None:
        require(self.sigma >= 0, "sigma", self.sigma, "must be >= 0")


@DEFENCES.register("gaussian")
class GaussianNoise(Defence):
    """Adds N(0, sigma^2) to every coordinate of the upload."""

    Params = GaussianParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        return {k: t + noise_like(rng.normal, t, self.params.sigma) for k, t in update.items()}


@dataclass(frozen=True)
class LaplaceParams:
    """``scale``: the Laplace scale b (standard deviation b * sqrt(2)) per coordinate."""

    scale: float

    def __post_init__(self) -> None:
        require(self.scale >= 0, "scale", self.scale, "must be >= 0")


@DEFENCES.register("laplace")
class LaplaceNoise(Defence):
    """Adds Laplace(0, scale) noise to every coordinate of the upload."""

    Params = LaplaceParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        return {k: t + noise_like(rng.laplace, t, self.params.scale) for k, t in update.items()}


@dataclass(frozen=True)
class ClipParams:
    """``max-norm``: bound on the L2 norm of the whole update."""

    max_norm: float

    def __post_init__(self) -> None:
        require(self.max_norm > 0, "max-norm", self.max_norm, "must be > 0")


@DEFENCES.register("clip")
class NormClip(Defence):
    """Scales the update down to L2 norm ``max-norm`` when it is longer."""

    Params = ClipParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        return clip_to_norm(update, self.params.max_norm)
