"""Compression of the uploaded update: ``prune`` (smallest magnitudes zeroed) and
``quantize`` (uniform levels, or half precision)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from fedsim.clients.defences.base import (
    DEFENCES,
    Defence,
    Tensors,
)
from fedsim.core.config import require


@dataclass(frozen=True)
class PruneParams:
    """``share``: the fraction of the update's entries with the smallest magnitudes set to 0;
    ``scope``: ranked within each tensor (``layer``) or over the whole update (``global``)."""

    share: float
    scope: Literal["layer", "global"] = "layer"

    def __post_init__(self) -> None:
        require(0 <= self.share < 1, "share", self.share, "must be in [0, 1)")
        require(
            self.scope in ("layer", "global"), "scope", self.scope, 'must be "layer" or "global"'
        )


def _smallest_zeroed(values: torch.Tensor, count: int) -> torch.Tensor:
    """``values`` (flat) with its ``count`` smallest magnitudes set to 0 (ties by position)."""
    out = values.clone()
    out[torch.argsort(values.abs(), stable=True)[:count]] = 0
    return out


@DEFENCES.register("prune")
class Prune(Defence):
    """Gradient pruning, DLG's own defence (Zhu et al. 2019, section 5: above about 20 %
    of the smallest magnitudes zeroed, DLG fails): the smallest ``share`` of the update's
    entries by magnitude are zeroed, per tensor or over the whole update."""

    Params = PruneParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        share = self.params.share
        if share == 0:
            return update
        if self.params.scope == "layer":
            return {
                k: _smallest_zeroed(t.flatten(), int(share * t.numel())).reshape(t.shape)
                for k, t in update.items()
            }
        flat = torch.cat([t.flatten() for t in update.values()])
        pruned = _smallest_zeroed(flat, int(share * flat.numel())).split(
            [t.numel() for t in update.values()]
        )
        return {k: p.reshape(t.shape) for (k, t), p in zip(update.items(), pruned, strict=True)}


@dataclass(frozen=True)
class QuantizeParams:
    """``bits``: each tensor rounded to ``2^(bits-1) - 1`` levels either side of 0, up to its
    largest magnitude (symmetric uniform quantisation, round to nearest); ``half``: cast to
    IEEE half precision instead (``bits`` must then be 16)."""

    bits: int = 8
    half: bool = False

    def __post_init__(self) -> None:
        require(2 <= self.bits <= 16, "bits", self.bits, "must be in [2, 16]")
        require(
            not self.half or self.bits == 16,
            "half",
            self.half,
            "half precision is 16 bits: set bits = 16 or half = false",
        )


@DEFENCES.register("quantize")
class Quantize(Defence):
    """The update quantised before upload, as communication-efficient FL does."""

    Params = QuantizeParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        if self.params.half:
            return {k: t.half().to(t.dtype) for k, t in update.items()}
        levels = 2 ** (self.params.bits - 1) - 1
        out = {}
        for k, t in update.items():
            step = float(t.abs().max()) / levels
            out[k] = t if step == 0 else torch.round(t / step) * step
        return out
