"""Analytic attacks: a batch read off the gradient in closed form, no gradient matching.

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

Every analytic attack needs the true gradient, so it applies to a gradient
probe and to one local step of plain SGD (FedSGD), where ``(w_global - w)/lr``
is the gradient exactly. It refuses several local steps (the update is then a
sum of gradients at different weights: no row ratio is an input) and Adam or
momentum (an Adam step's entries are close to ``lr * sign(g)``: the ratios
carry little more than signs). These refusals are one line at scenario
validation (:meth:`AnalyticAttack.check_setting`) and a ``ValueError`` on an
observation that breaks them.

Each sets :attr:`~fedsim.attacks.base.Reconstruction.converged` and
``steps_taken`` (0 for the closed form). An analytic attack models the client
as one gradient step, so its fidelity
residual (:mod:`fedsim.audit.fidelity`) is that step's gradient on the
true batch against the intercepted one: zero for an exact FedSGD upload. Its
reconstruction's own residual, which the attacker can compute, is in
``details["gradient_residual"]``.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from fedsim.attacks.base import Attack, AttackSetting, Observation, Reconstruction
from fedsim.attacks.closed_form import (
    INVERTED,
    exact_gradient,
    invert_features,
    linear_layers,
    one_step_residual,
    reads_image,
    setting_batch,
    setting_model,
    uploaded,
)
from fedsim.attacks.gradients import (
    victim_model,
)
from fedsim.attacks.labels import infer_labels, label_method
from fedsim.attacks.registry import ATTACKS
from fedsim.core.config import require
from fedsim.core.models import SplitNet


class AnalyticAttack(Attack):
    """A closed-form attack on an exact gradient (a probe or one plain SGD step)."""

    max_batch: ClassVar[int]

    @classmethod
    def registered_name(cls) -> str:
        """The name it is registered under, for its refusals and errors."""
        return ATTACKS.name_of(cls)

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Refuse audits without an exact gradient, batches over :attr:`max_batch`,
        and architectures :meth:`check_architecture` rejects."""
        batch = setting_batch(setting, cls.registered_name(), key)
        require(
            batch is None or batch <= cls.max_batch,
            f"{key}.name",
            cls.registered_name(),
            f"reads batches of at most {cls.max_batch}; the audited gradients hold {batch}",
        )
        cls.check_architecture(setting, key)

    @classmethod
    @abstractmethod
    def check_architecture(cls, setting: AttackSetting, key: str) -> None:
        """Raise :class:`~fedsim.core.config.ScenarioError` unless the shared layers fit."""

    def check_batch(self, observation: Observation) -> None:
        """Refuse an observation over :attr:`max_batch` examples (``ValueError``)."""
        if observation.num_examples > self.max_batch:
            raise ValueError(
                f"{self.registered_name()} reads batches of at most {self.max_batch}; "
                f"this one holds {observation.num_examples}"
            )

    def fidelity_residual(
        self, observation: Observation, images: torch.Tensor, labels: torch.Tensor, seed: int = 0
    ) -> float:
        """:func:`one_step_residual` of the true batch: the attack models the client
        as one gradient step, which an exact FedSGD upload or probe is."""
        return one_step_residual(observation, images, labels, seed, self.device)


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


@dataclass(frozen=True)
class AnalyticFCParams:
    """``analytic-fc``'s settings.

    Attributes
    ----------
    layer:
        The linear layer to read (a module name such as ``classifier.1``), or
        ``auto``: the first shared ``nn.Linear`` with a bias.
    row_floor:
        Rows whose bias gradient is below this fraction of the largest one are
        left out (their ratio is float noise over a near-zero divisor).
    inversion_steps:
        Adam steps inverting recovered features through the extractor (0:
        return the features only, with grey images).
    inversion_lr:
        Adam's learning rate for the inversion, in pixel units, constant.

    Inversion defaults, measured on four ``lenet5-split`` FedSGD digits (one
    thread): 1,000 steps at 0.2 gave 30.8 / 37.7 / 34.5 / 36.3 dB in about
    2.2 s each; 500 steps 28.2-34.7 dB; a tenfold decay at 3/8, 5/8, 7/8 (as
    Inverting Gradients) cost 3-7 dB at 500 steps, and lr 0.03-0.1 converged
    slower. Inverting Gradients (1,000 steps x 2 restarts) reached 27.6 /
    25.3 / 25.9 / 28.3 dB on the same uploads in 13-16 s.
    """

    layer: str = "auto"
    row_floor: float = 1e-4
    inversion_steps: int = 1000
    inversion_lr: float = 0.2

    def __post_init__(self) -> None:
        require(0 <= self.row_floor < 1, "row-floor", self.row_floor, "must be in [0, 1)")
        require(self.inversion_steps >= 0, "inversion-steps", self.inversion_steps, "must be >= 0")
        require(self.inversion_lr > 0, "inversion-lr", self.inversion_lr, "must be > 0")


def read_linear_input(
    weight_grad: torch.Tensor, bias_grad: torch.Tensor, row_floor: float
) -> tuple[torch.Tensor, int, float]:
    """The input of a linear layer at batch 1 from its weight and bias gradients.

    Every row ``i`` gives ``x = G_i / g_i``; they are combined by least
    squares over the rows whose ``|g_i|`` reaches ``row_floor * max |g|``:
    ``x = sum_i g_i G_i / sum_i g_i^2``, which weights each row's ratio by
    ``g_i^2`` so rows with tiny divisors (the noisiest ratios) count least.

    Returns
    -------
    The input ``(D,)``, the number of rows used, and the rank-one residual
    ``||G - g x^T|| / ||G||``: zero when every row agrees, as at batch 1; a
    batch of several examples or noise shows up here.
    """
    weight, bias = weight_grad.double(), bias_grad.double()
    rows = bias.abs() >= row_floor * bias.abs().max()
    if not bool(rows.any()) or float(bias.abs().max()) == 0:
        raise ValueError("every bias gradient is zero: the layer's input cannot be read")
    g, grad = bias[rows], weight[rows]
    x = (g @ grad) / (g @ g)
    spread = float((weight - torch.outer(bias, x)).norm() / weight.norm().clamp_min(1e-300))
    return x.float(), int(rows.sum()), spread


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
