"""The first-layer attacks' base: a batch read off the first layer's weight and bias
gradients (``spear``, ``box-vertices``, ``cocktail-party``, ``adam-signs``'s layer).

:class:`FirstLayerAttack` refuses a model whose first layer it cannot read;
:func:`first_linear_layer` is the layer most of them read; :func:`example_labels`
gives each recovered example its label from the first layer's gradient, and a
reconstruction whose gradient residual is at most :data:`EXACT` reproduces the upload.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.toolkits.analytic import AnalyticAttack
from fedsim.attacks.toolkits.closed_form import (
    exact_gradient,
    linear_layers,
    reads_image,
    setting_model,
    uploaded,
)
from fedsim.attacks.toolkits.gradients import soft_cross_entropy, victim_model
from fedsim.core.config import require
from fedsim.core.models import SplitNet

EXACT = 1e-3
"""A reconstruction whose gradient residual is at most this reproduces the upload."""


class FirstLayerAttack(AnalyticAttack):
    """An analytic attack on the first layer's weight and bias gradients, a batch at a time."""

    layer_needs: ClassVar[str]  # what the first layer must be, for the refusal

    @staticmethod
    @abstractmethod
    def first_layer(model: nn.Module) -> str | None:
        """The first layer's module name if the attack can read it, else ``None``."""

    @classmethod
    def check_architecture(cls, setting: AttackSetting, key: str) -> None:
        """The first layer is one :meth:`first_layer` accepts, and shared."""
        layer = cls.first_layer(setting_model(setting))
        require(
            layer is not None and uploaded(f"{layer}.weight", setting.uploads),
            f"{key}.name",
            cls.registered_name(),
            f"needs a shared first {cls.layer_needs}; "
            f"model {setting.model.name!r} under strategy {setting.strategy!r} has none",
        )

    def first_layer_gradient(
        self, observation: Observation, seed: int
    ) -> tuple[SplitNet, dict[str, torch.Tensor], str, torch.Tensor, torch.Tensor]:
        """The sent model, its parameters, the first layer's name and its weight and bias
        gradients (float64), refusing observations the attack cannot read."""
        self.check_batch(observation)
        gradient = exact_gradient(observation, self.registered_name())
        model, params = victim_model(observation, self.device, seed)
        layer = self.first_layer(model)
        if layer is None or f"{layer}.weight" not in observation.shared:
            raise ValueError(f"{self.registered_name()} needs the shared first {self.layer_needs}")
        weight, bias = gradient[f"{layer}.weight"].double(), gradient[f"{layer}.bias"].double()
        return model, params, layer, weight, bias


def first_linear_layer(model: nn.Module) -> str | None:
    """The first linear layer if it reads the image and has a bias, else ``None``."""
    layers = linear_layers(model)
    if not layers or not reads_image(model, layers[0][0]) or layers[0][1].bias is None:
        return None
    return layers[0][0]


def example_labels(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    layer: str,
    inputs: torch.Tensor,
    deltas: torch.Tensor,
    device: torch.device,
) -> torch.Tensor:
    """Each example's label: the class whose first-layer gradient ``delta_n(c)``
    (per example, scaled ``1/B``) is nearest the recovered ``delta_n`` (rows of ``deltas``)."""
    batch, classes = len(inputs), int(functional_call(model, params, (inputs[:1],)).shape[1])
    bias = f"{layer}.bias"
    fixed = {n: p.detach() for n, p in params.items() if n != bias}

    def example_delta(b: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, {**fixed, bias: b}, (x[None],))
        return soft_cross_entropy(logits, y[None]) / batch

    targets = F.one_hot(torch.arange(classes), classes).float().to(device)
    each = vmap(vmap(grad(example_delta), (None, None, 0)), (None, 0, None))
    candidates = each(params[bias].detach(), inputs.to(device), targets)  # (B, K, m)
    mismatch = (candidates - deltas[:, None, :].to(device)).norm(dim=2)
    return mismatch.argmin(dim=1)
