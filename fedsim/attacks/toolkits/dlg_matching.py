"""DLG's objective on the gradient-matching loop, which ``dlg`` and its variants share.

:class:`DLGMatching` is DLG (Zhu et al. 2019; :mod:`fedsim.attacks.reconstruction.dlg`
states the method) unregistered: the squared L2 distance between gradients, its
settings (:class:`DLGParams`, the loop's own defaults) and its step caps. ``dlg``
registers it as it is; ``unrolled-dlg`` and ``aligned-dlg`` extend it through the
loop's hooks (:mod:`fedsim.attacks.toolkits.matching`).
"""

from __future__ import annotations

import torch

from fedsim.attacks.presets import StepCaps
from fedsim.attacks.toolkits.matching import GradientMatchingAttack
from fedsim.core.params.matching import DLGParams


class DLGMatching(GradientMatchingAttack):
    """DLG's squared L2 gradient distance with its step caps; its variants extend it."""

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
