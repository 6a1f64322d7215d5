"""Compression of the uploaded update: ``prune`` (smallest magnitudes zeroed) and
``quantize`` (uniform levels, or half precision)."""

from __future__ import annotations

import numpy as np
import torch

from fedsim.clients.defences.base import (
    DEFENCES,
    Defence,
    Tensors,
)
from fedsim.core.params.defences import PruneParams, QuantizeParams


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
