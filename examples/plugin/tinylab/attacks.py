"""tinylab's attack: the first linear layer's gradient rows divided by its bias gradient.

For ``z = W x + b`` trained on one example, ``dL/dW_i = (dL/db_i) x``: any row
with a non-zero bias gradient is the input itself (Phong et al. 2017). Like every
fedsim attack it reads an :class:`~fedsim.attacks.base.Observation` only (what the
server received and sent, and public facts), never the client's data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedsim.attacks.base import Attack, Observation, Reconstruction
from fedsim.attacks.registry import ATTACKS
from fedsim.core.config import require


@dataclass(frozen=True)
class RowRatioParams:
    """``min-bias``: bias gradients smaller than this (in absolute value) are skipped."""

    min_bias: float = 1e-8

    def __post_init__(self) -> None:
        require(self.min_bias > 0, "min-bias", self.min_bias, "must be > 0")


def _gradient(observation: Observation) -> dict[str, torch.Tensor]:
    """``dL/dtheta``: a shared gradient as is; an update as ``(w_global - w) / lr``."""
    if observation.shared_kind == "gradient":
        return dict(observation.shared)
    lr = observation.train_config.lr
    return {k: (observation.global_params[k] - v) / lr for k, v in observation.shared.items()}


@ATTACKS.register("tinylab-row-ratio")
class RowRatio(Attack):
    """tinylab's closed-form attack on a first linear layer over the pixels (tinylab-mlp)."""

    Params: ClassVar[type] = RowRatioParams

    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        started = time.perf_counter()
        spec = observation.input_spec
        pixels = spec.channels * spec.image_size**2
        gradient = _gradient(observation)
        weight = next(
            name
            for name, g in gradient.items()
            if g.dim() == 2
            and g.shape[1] == pixels
            and name.removesuffix("weight") + "bias" in gradient
        )
        rows, bias = gradient[weight], gradient[weight.removesuffix("weight") + "bias"]
        # The rows with the largest bias gradients, one per example the client trained on.
        count = max(1, observation.num_examples)
        best = bias.abs().argsort(descending=True)[:count]
        best = best[bias[best].abs() > self.params.min_bias]
        if len(best) == 0:
            raise ValueError("no bias gradient of the first linear layer is non-zero")
        inputs = (rows[best] / bias[best, None]).reshape(
            -1, spec.channels, spec.image_size, spec.image_size
        )
        inputs = inputs[torch.arange(count) % len(inputs)]  # as many images as examples
        images = observation.normalization.to_pixels(inputs).clamp(0, 1)
        # Labels: the last bias's gradient is most negative at the true class (batch of one).
        biases = [g for name, g in gradient.items() if name.endswith("bias") and g.dim() == 1]
        labels = biases[-1].argmin().repeat(count)
        return Reconstruction(
            images=images.detach().to(self.device),
            labels=labels.to(self.device),
            objective_trace=[],
            iterations=0,
            final_objective=0.0,
            seconds=time.perf_counter() - started,
            converged=True,
        )
