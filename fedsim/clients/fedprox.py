"""FedProx's client (Li et al. 2020): cross-entropy plus a proximal term.

The strategy sends ``proximal-mu`` in the (public) train config; the local
objective is ``CE + (mu / 2) * ||w - w_global||^2`` over every parameter.
"""

from __future__ import annotations

import torch
from flwr.app import ConfigRecord
from torch import nn

from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientRoutine
from fedsim.core import protocol
from fedsim.core.models import SplitNet
from fedsim.core.training import LossFn, cross_entropy_loss


def proximal_loss(model: SplitNet, mu: float) -> LossFn:
    """Cross-entropy plus ``(mu/2) * ||w - w0||^2``, ``w0`` the weights ``model`` has now."""
    anchor = [p.detach().clone() for p in model.parameters()]

    def loss(net: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        distance = sum(
            ((p - p0) ** 2).sum() for p, p0 in zip(net.parameters(), anchor, strict=True)
        )
        return cross_entropy_loss(net, images, labels) + 0.5 * mu * distance

    return loss


@CLIENT_ROUTINES.register("fedprox")
class FedProxClient(ClientRoutine):
    """Trains the whole received model with the proximal objective; uploads all of it."""

    def loss(self, model: SplitNet, config: ConfigRecord) -> LossFn:
        # Called on the freshly loaded global model, so it anchors at w_global.
        return proximal_loss(model, protocol.read_float(config, protocol.PROXIMAL_MU))
