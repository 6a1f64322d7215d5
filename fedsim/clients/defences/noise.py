"""Noise and clipping on the uploaded update: ``gaussian``, ``laplace``, ``clip``."""

from __future__ import annotations

import numpy as np

from fedsim.clients.defences.base import (
    DEFENCES,
    Defence,
    Tensors,
    clip_to_norm,
    noise_like,
)
from fedsim.core.params.defences import ClipParams, GaussianParams, LaplaceParams


@DEFENCES.register("gaussian")
class GaussianNoise(Defence):
    """Adds N(0, sigma^2) to every coordinate of the upload."""

    Params = GaussianParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        return {k: t + noise_like(rng.normal, t, self.params.sigma) for k, t in update.items()}


@DEFENCES.register("laplace")
class LaplaceNoise(Defence):
    """Adds Laplace(0, scale) noise to every coordinate of the upload."""

    Params = LaplaceParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        return {k: t + noise_like(rng.laplace, t, self.params.scale) for k, t in update.items()}


@DEFENCES.register("clip")
class NormClip(Defence):
    """Scales the update down to L2 norm ``max-norm`` when it is longer."""

    Params = ClipParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        return clip_to_norm(update, self.params.max_norm)
