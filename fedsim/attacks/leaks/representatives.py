"""One representative per class a client holds, read from its output layer's update.

For the output layer ``logits = W h + b`` and the mean loss over ``B``
examples, class ``c``'s rows are ``dL/dW_c = (1/B) sum_n (p_nc - y_nc) h_n``
and ``dL/db_c = (1/B) sum_n (p_nc - y_nc)``, so ``dL/dW_c / dL/db_c`` is a
weighted mean of the last layer's inputs ``h`` in the client's data, weights
``p_nc - y_nc``: dominated by class ``c``'s own examples (negative weights)
where the class is present. Exact for a gradient; for several SGD steps the
update sums gradients at nearby weights (approximate); under Adam each entry
is close to ``lr * sign``, and the ratio carries little more than signs
(measured in docs/leaks.md).

``class-representatives`` (:class:`ClassRepresentatives`) reads that feature
vector for each class whose bias gradient is negative (the classes the update
indicates present), then, where the server sent the network below the output
layer (FedAvg, FedProx), inverts all of them at once to images through it with
the feature inversion of ``analytic-fc``
(:func:`~fedsim.attacks.toolkits.closed_form.invert_features`). Where the extractor stays
private (FedSplit, FedCG) it returns the feature vectors only, to be scored in
feature space. It runs on the audit's victims only (``every_client`` false), when
named (``audit.leaks = "auto"`` runs ``model-inversion`` instead).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from fedsim.attacks.base import AttackSetting
from fedsim.attacks.leakage import LEAKS, LeakAnalysis, LeakInput, RepresentativesLeak
from fedsim.attacks.toolkits.closed_form import Inversion, linear_layers
from fedsim.attacks.toolkits.gradients import target_gradient, victim_model
from fedsim.attacks.toolkits.output_layer import check_output_layer
from fedsim.core.params.leaks import RepresentativesParams


@LEAKS.register("class-representatives")
class ClassRepresentatives(LeakAnalysis):
    """Each present class's output-row ratio, inverted to an image where the extractor was sent."""

    Params = RepresentativesParams
    params: RepresentativesParams
    kind = "representatives"
    every_client = False

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Refuse a model without an output bias or a strategy that never uploads it."""
        check_output_layer(setting, key, "class-representatives")

    def analyse(self, inputs: LeakInput, seed: int = 0) -> RepresentativesLeak:
        """Features per present class, and images where the layers below were sent."""
        start = time.perf_counter()
        observation = inputs.observation
        model, params = victim_model(observation, self.device, seed)
        name, layer = linear_layers(model)[-1]
        gradient = target_gradient(observation, self.device)
        weight, bias = gradient[f"{name}.weight"].double(), gradient[f"{name}.bias"].double()
        classes = torch.nonzero(bias < 0).flatten()
        features = (weight[classes] / bias[classes, None]).float()
        private = any(n not in observation.global_params for n, _ in model.named_parameters())
        details: dict[str, Any] = {"layer": name, "extractor": "private" if private else "sent"}
        steps = 0 if private else self.params.inversion_steps
        inversion = Inversion(model, params, layer, steps, self.params.inversion_lr)
        return inversion.leak(observation, classes, features, start, details)
