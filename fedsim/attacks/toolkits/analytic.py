"""The analytic attacks' base: a batch read off an exact gradient in closed form.

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

:func:`read_linear_input` is the read itself for a linear layer at batch 1
(``analytic-fc``; R-GAP's last layer).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch

from fedsim.attacks.base import Attack, AttackSetting, Observation
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.closed_form import one_step_residual, setting_batch
from fedsim.core.config import require


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
