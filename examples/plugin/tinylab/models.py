"""A tiny MLP in fedsim's model shape: an extractor, then a classifier (a ``SplitNet``)."""

from __future__ import annotations

from torch import nn

from fedsim.core.models import MODELS, InputSpec, SplitNet

HIDDEN = 64


@MODELS.register("tinylab-mlp")
def tiny_mlp(spec: InputSpec) -> SplitNet:
    """tinylab's MLP: one 64-unit ReLU layer on the raw pixels, then the logits."""
    extractor = nn.Sequential(
        nn.Flatten(), nn.Linear(spec.channels * spec.image_size**2, HIDDEN), nn.ReLU()
    )
    return SplitNet(extractor, nn.Sequential(nn.Flatten(), nn.Linear(HIDDEN, spec.num_classes)))
