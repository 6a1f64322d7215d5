"""The fidelity residual: does an attack's model of the client explain what was uploaded?

The scorer holds the victim's true batch. Feeding it through the attack's own
model of the client (its ``simulated_gradient``, with the schedule, BatchNorm
knowledge and estimated private layers the attack would use) and comparing
with what the server intercepted gives

    residual = ||simulated - intercepted|| / ||intercepted||

(both in gradient orientation, over every shared layer). Near zero (float
rounding, below 1e-5 here) the attack optimises against an exact model: a
failed reconstruction is the optimiser's fault, not the model's. A large
residual says the target is unreachable even with the true images, and
:func:`residual_note` names the likely cause. The truth goes to the attack's
public :meth:`~fedsim.attacks.toolkits.matching.GradientMatchingAttack.fidelity_residual`
(or :meth:`~fedsim.attacks.toolkits.analytic.AnalyticAttack.fidelity_residual`: one
gradient step, the analytic attacks' model) as an explicit argument here, on
the driver side, after the attack has run: never through an
:class:`~fedsim.attacks.base.Observation`.
"""

from __future__ import annotations

import math

import torch

from fedsim.attacks.base import Observation, Reconstruction
from fedsim.attacks.reconstruction.dlg import DLG
from fedsim.attacks.toolkits.analytic import AnalyticAttack
from fedsim.attacks.toolkits.gradients import local_steps_taken
from fedsim.attacks.toolkits.matching import GradientMatchingAttack
from fedsim.core.components import Resolved
from fedsim.core.models import build_model
from fedsim.core.params.matching import DLGParams
from fedsim.core.threat import SharedKind
from fedsim.core.truth import GroundTruth

REPLAYING = ("unrolled-dlg", "fedavg-leakage")
"""Attacks that replay the client's local steps (whatever ``unroll`` says)."""

MATCHED = 1e-4
"""Residuals at or below this count as an exact model (float32 rounding is ~1e-7..1e-6)."""


def fidelity_residual(
    attack: Resolved, observation: Observation, truth: GroundTruth, seed: int
) -> float:
    """The attack's residual on the true batch; NaN for attacks without a model of the client."""
    # Analytic attacks model the client as one gradient step (exact for FedSGD and probes).
    if not issubclass(attack.cls, GradientMatchingAttack | AnalyticAttack):
        return math.nan  # e.g. GRNN: its generator, not a client model, produces the dummy
    instance = attack.create()
    with torch.no_grad():
        images, labels = truth.images.float(), truth.labels.long()
    return instance.fidelity_residual(observation, images, labels, seed)


def attacker_residual(
    attack: Resolved, observation: Observation, rec: Reconstruction, seed: int
) -> float:
    """The residual of the attack's own reconstruction: computable without the truth.

    Through the attack's model of the client where it has one, else (GRNN)
    through DLG's plain one-gradient model. Across attacks on one victim, the
    lowest is the reconstruction the attacker itself would pick. Closed-form
    attacks computed it themselves (``details["gradient_residual"]``, the one
    gradient step of :func:`~fedsim.attacks.toolkits.closed_form.one_step_residual` with the
    same seed): it is not computed twice.
    """
    own = rec.details.get("gradient_residual")
    if issubclass(attack.cls, AnalyticAttack) and own is not None:
        return float(own)
    like_dlg = issubclass(attack.cls, GradientMatchingAttack)
    model: GradientMatchingAttack = attack.create() if like_dlg else DLG(DLGParams())
    return model.fidelity_residual(observation, rec.images.float(), rec.labels.long(), seed)


def residual_note(
    residual: float, attack: Resolved, observation: Observation, batchnorm: str
) -> str:
    """Why the residual is large, from what the record knows ("" when it is not)."""
    if math.isnan(residual) or residual <= MATCHED:
        return ""
    cfg = observation.train_config
    steps = local_steps_taken(observation)
    unrolls = getattr(attack.params, "unroll", False) or attack.name in REPLAYING
    model = build_model(observation.model, observation.input_spec)
    if any(n not in observation.global_params for n, _ in model.named_parameters()):
        return "private layers (an extractor): the attack uses a random estimate of them"
    if observation.shared_kind == SharedKind.UPDATE and steps > 1 and not unrolls:
        return f"{steps}-step update read as one gradient step"
    reshuffled = cfg.local_steps == 0 and cfg.local_epochs > 1
    if (
        reshuffled
        and observation.shared_kind == SharedKind.UPDATE
        and observation.num_examples > cfg.batch_size
    ):
        return "later epochs reshuffle batches the attacker cannot order"
    if batchnorm == "batch-of-dummy":
        return "BatchNorm statistics unknown to the attacker"
    return (
        "the upload is not the modelled client's plain training: a client-side "
        "defence (noise, clipping, DP-SGD) or a private optimiser state changed it"
    )
