"""SAPAG (Wang et al. 2020): a Gaussian-kernel gradient distance.

    D = sum_l Q_l * sum_i (1 - exp(-(g'_{l,i} - g_{l,i})^2 / sigma_l^2))

element-wise over layer ``l``'s gradient entries, with ``sigma_l^2 = Var(g_l)``
of the received gradient (adaptive to its scale, which is what lets it work
under Xavier-normal weights where the gradients are tiny) and ``Q_l``
decreasing with depth, so the layers nearest the input weigh most. The dummy
starts from N(0, 1) or a constant and is clamped into the data range after
every update (Algorithm 1: update, then normalise). With L-BFGS that means
after every inner iteration: clamping only between ``torch.optim.LBFGS``
steps lets one step throw the dummy far outside the range, and the clamp
then pins every pixel to a bound where the kernel is flat (measured on
LeNet-Zhu/CIFAR-100, Xavier init: about half the restarts ended so at 5 dB;
with per-iteration clamping none did).

LeNet: L-BFGS lr 1, 500 steps; ResNet-18: AdamW lr 1e-3, 20,000 steps. The
paper also optimises dummy labels; their softmax keeps them in range, so
only the images are clamped.
"""

from __future__ import annotations

import torch

from fedsim.attacks.presets import StepCaps
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.matching import GradientMatchingAttack
from fedsim.core.params.matching import SAPAGParams


@ATTACKS.register("sapag")
class SAPAG(GradientMatchingAttack):
    """Self-Adaptive Privacy Attack from Gradients."""

    Params = SAPAGParams
    params: SAPAGParams
    step_caps = StepCaps(100, resnet=50, measured={"lenet5-split": 100, "lenet-zhu": 25})

    def distance_constants(
        self, target: list[torch.Tensor], depths: list[int]
    ) -> list[torch.Tensor]:
        """Per parameter tensor: ``[Q_l, sigma_l^2]`` of its layer."""
        p = self.params
        if p.layer_weights and max(depths) > len(p.layer_weights):
            raise ValueError(
                f"layer-weights gives {len(p.layer_weights)} values; the observed layers "
                f"reach depth {max(depths)}"
            )
        variance = {
            depth: torch.cat(
                [t.flatten() for t, d in zip(target, depths, strict=True) if d == depth]
            )
            .var()
            .clamp(min=torch.finfo(target[0].dtype).tiny)
            for depth in set(depths)
        }
        return [
            torch.stack(
                [
                    torch.tensor(
                        p.layer_weights[d - 1] if p.layer_weights else d**-p.depth_decay,
                        dtype=variance[d].dtype,
                        device=variance[d].device,
                    ),
                    variance[d],
                ]
            )
            for d in depths
        ]

    @staticmethod
    def distance(
        dummy: list[torch.Tensor], target: list[torch.Tensor], constants: list[torch.Tensor]
    ) -> torch.Tensor:
        """``sum_l Q_l sum_i (1 - exp(-(g'_{l,i} - g_{l,i})^2 / sigma_l^2))``."""
        terms = [
            c[0] * (1 - torch.exp(-(d - t).square() / c[1])).sum()
            for d, t, c in zip(dummy, target, constants, strict=True)
        ]
        return torch.stack(terms).sum()
