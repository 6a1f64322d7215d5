"""``analytic-fc``: a linear layer's input read off its gradient in closed form.

For a linear layer ``z = W x + b`` of a network trained on the mean loss over a
batch of ``B`` examples,

    dL/dW = sum_n delta_n x_n^T,    dL/db = sum_n delta_n,    delta_n = (1/B) dL_n/dz_n,

so at ``B = 1`` every row ``i`` with ``dL/db_i != 0`` holds the layer's input
scaled by that entry: ``x = (dL/dW_i) / (dL/db_i)`` (Phong et al. 2017;
Geiping et al. 2020, section 4). ``analytic-fc`` (:class:`AnalyticFC`) reads
it from the first shared linear layer with a bias: on an MLP whose first layer
is shared (``mlp-2nn`` under FedAvg) that input is the image itself; on a conv
net it is the feature vector, which is then inverted through the extractor
(``E(x') = f``: first-order, far easier than matching gradients). Under
FedSplit / FedCG the extractor is private: the features are recovered as
exactly as under FedAvg, but can only be inverted through the attacker's
random estimate E~ (flagged ``extractor = "estimate"`` in the details).

Where it applies, and what it records, as every analytic attack
(:mod:`fedsim.attacks.toolkits.analytic`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from fedsim.attacks.base import AttackSetting, Observation, Reconstruction
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.analytic import AnalyticAttack, read_linear_input
from fedsim.attacks.toolkits.closed_form import (
    INVERTED,
    exact_gradient,
    invert_features,
    linear_layers,
    one_step_residual,
    reads_image,
    setting_model,
    uploaded,
)
from fedsim.attacks.toolkits.gradients import (
    victim_model,
)
from fedsim.attacks.toolkits.labels import infer_labels, label_method
from fedsim.core.config import require
from fedsim.core.models import SplitNet
from fedsim.core.params.analytic import AnalyticFCParams


@ATTACKS.register("analytic-fc")
class AnalyticFC(AnalyticAttack):
    """A linear layer's input read from its weight and bias gradients at batch 1."""

    Params = AnalyticFCParams
    params: AnalyticFCParams
    max_batch = 1

    @classmethod
    def check_architecture(cls, setting: AttackSetting, key: str) -> None:
        """Some shared linear layer has a bias (a named ``layer`` is checked per observation)."""
        found = [
            n
            for n, m in linear_layers(setting_model(setting))
            if m.bias is not None and uploaded(f"{n}.weight", setting.uploads)
        ]
        require(
            bool(found),
            f"{key}.name",
            cls.registered_name(),
            f"needs a shared linear layer with a bias; model {setting.model.name!r} "
            f"under strategy {setting.strategy!r} shares none",
        )

    def chosen_layer(self, model: SplitNet, observation: Observation) -> tuple[str, nn.Linear]:
        """The layer :attr:`AnalyticFCParams.layer` names, shared with its bias."""
        for name, module in linear_layers(model):
            shared = f"{name}.weight" in observation.shared and f"{name}.bias" in observation.shared
            if shared and self.params.layer in ("auto", name):
                return name, module
        raise ValueError(
            f"analytic-fc needs a shared linear layer with a bias ({self.params.layer}); "
            "the server received none"
        )

    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        """Read the layer's input, then invert it to an image unless it is the image."""
        start = time.perf_counter()
        self.check_batch(observation)
        gradient = exact_gradient(observation, self.registered_name())
        model, params = victim_model(observation, self.device, seed)
        name, layer = self.chosen_layer(model, observation)
        features, rows, spread = read_linear_input(
            gradient[f"{name}.weight"], gradient[f"{name}.bias"], self.params.row_floor
        )
        features = features.to(self.device)[None]
        spec, norm = observation.input_spec, observation.normalization
        shape = (1, spec.channels, spec.image_size, spec.image_size)
        direct = reads_image(model, name)
        private = any(n not in observation.global_params for n, _ in model.named_parameters())
        details: dict[str, Any] = {
            "layer": name,
            "rows_used": rows,
            "rank1_residual": spread,
            "labels": label_method(observation),
        }
        # The read is exact by construction; an inversion has converged when it
        # reproduces the features (it may still land on another image with them).
        steps, converged = 0, True
        if direct:
            x = features.reshape(shape)
            details["extractor"] = "none"
        else:
            x, residual = self.invert(model, params, layer, features, observation)
            steps, converged = self.params.inversion_steps, residual <= INVERTED
            details.update(
                features=features.cpu(),
                feature_residual=residual,
                extractor="estimate" if private else "sent",
            )
        images = norm.to_pixels(x.detach().cpu()).clamp(0, 1)
        labels = infer_labels(observation, self.device).cpu()
        details["gradient_residual"] = one_step_residual(
            observation, images, labels, seed, self.device
        )
        return Reconstruction(
            images=images,
            labels=labels,
            objective_trace=[],
            iterations=steps,
            final_objective=spread,
            seconds=time.perf_counter() - start,
            steps_taken=steps,
            converged=converged,
            details=details,
        )

    def invert(
        self,
        model: SplitNet,
        params: dict[str, torch.Tensor],
        layer: nn.Module,
        features: torch.Tensor,
        observation: Observation,
    ) -> tuple[torch.Tensor, float]:
        """:func:`invert_features` of one feature vector, reporting progress."""
        x, residuals = invert_features(
            model,
            params,
            layer,
            features,
            observation,
            self.params.inversion_steps,
            self.params.inversion_lr,
            self.report_progress,
        )
        return x, float(residuals[0])
