"""DLG (Zhu et al. 2019): match the squared L2 distance between gradients.

Dummy images ``x' ~ N(0, 1)`` and dummy label logits ``y' ~ N(0, 1)`` (soft
labels through a softmax) are optimised jointly to minimise
``sum_layers ||g(x', y') - g||^2`` with L-BFGS (lr 1, PyTorch defaults: 20
evaluations per step) for 300 steps. ``labels = "infer"`` gives iDLG: the
label is read from the last layer first and kept fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedsim.attacks.matching import GradientMatchingAttack
from fedsim.attacks.matching_params import MatchingParams
from fedsim.attacks.presets import StepCaps
from fedsim.attacks.registry import ATTACKS


@dataclass(frozen=True)
class DLGParams(MatchingParams):
    """DLG's settings: :class:`MatchingParams`, whose defaults are DLG's."""


@ATTACKS.register("dlg")
class DLG(GradientMatchingAttack):
    """Deep Leakage from Gradients."""

    Params = DLGParams
    step_caps = StepCaps(100, resnet=50, measured={"lenet5-split": 10, "lenet-zhu": 100})

    @staticmethod
    def distance(
        dummy: list[torch.Tensor], target: list[torch.Tensor], constants: list[torch.Tensor]
    ) -> torch.Tensor:
        """``sum_l ||g'_l - g_l||^2``."""
        return torch.stack(
            [(d - t).square().sum() for d, t in zip(dummy, target, strict=True)]
        ).sum()
