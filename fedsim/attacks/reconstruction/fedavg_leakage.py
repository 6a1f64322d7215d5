"""Data leakage in Federated Averaging (Dimitrov, Balunovic, Konstantinov, Vechev, TMLR 2022).

A FedAvg update is several local epochs of several steps each. The attack
simulates the client's local training on dummy data with the hyper-parameters
the server sent (:func:`~fedsim.attacks.toolkits.matching_problem.replay_local_training`: SGD,
momentum, weight decay, Adam/AdamW, FedProx's term) and matches the simulated
update to the observed one. The client reshuffles every epoch with a seed the
server does not know, so each epoch gets its own dummy copy of the client's
``N`` examples, in slot order; the copies are tied by an epoch-order-invariant
prior (every image appears once per epoch, in an unknown place) and joined at
the end by matching every copy to the first (Hungarian on per-image MSE) and
averaging. Labels are soft, per slot and per epoch, so each step gets its own
label counts; the counts read from the update (bias-corrected counting) tie
every epoch's total.

Where fedsim differs from the authors' code (``eth-sri/fedavg_leakage``, JAX):
the prior here is a symmetric Chamfer distance between each copy and the
first (differentiable and order-free, so it runs inside the batched
objective), where the authors average copies matched by assignment; per-step
label counts are learnt as soft labels under a count prior instead of being
estimated from interpolated intermediate models; the objective is the
relative squared L2 distance of the updates, optimised with projected L-BFGS
(fedsim's ``unrolled-dlg`` optimiser), not the authors' Adam schedule.
Against Adam, whose first steps are nearly ``lr * sign(g)``, the replay
smooths Adam's denominator (``adam-smoothing``) so that the objective has a
gradient in the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from scipy.optimize import linear_sum_assignment

from fedsim.attacks.base import AttackSetting, Observation, Reconstruction
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.labels import infer_labels
from fedsim.attacks.toolkits.matching import GradientMatchingAttack
from fedsim.attacks.toolkits.matching_problem import (
    LocalSchedule,
    MatchingProblem,
    replay_local_training,
    require_replayable,
)
from fedsim.attacks.toolkits.replay import check_replayable_setting
from fedsim.core.params.matching import FedAvgLeakageParams
from fedsim.core.threat import ONE_UPDATE


def chamfer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean squared distance from each row of ``a`` to its nearest in ``b``, plus the reverse."""
    dim = a.shape[1]
    squared = a.square().sum(1)[:, None] + b.square().sum(1)[None, :] - 2 * a @ b.T
    squared = squared.clamp(min=0) / dim
    return squared.min(dim=1).values.mean() + squared.min(dim=0).values.mean()


@ATTACKS.register("fedavg-leakage")
class FedAvgLeakage(GradientMatchingAttack):
    """Dimitrov et al.'s attack on multi-epoch FedAvg updates."""

    Params = FedAvgLeakageParams
    params: FedAvgLeakageParams
    threat_models = ONE_UPDATE  # a probe is a gradient, an aggregate several updates

    @classmethod
    def audit_preset(cls, setting: AttackSetting) -> dict[str, Any]:
        """Whatever the model: it replays every local step per objective evaluation, and 60
        L-BFGS steps x 4 restarts is the smallest budget at which tests/test_fedavg_leakage.py
        saw an image of a 2-epoch SGD client recovered at 20 dB (40 x 2 recovered none)."""
        return {"steps": 60, "restarts": 4}

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Updates only, from local training the server can replay."""
        check_replayable_setting(setting, key, "fedavg-leakage")

    def reconstruct_many(
        self, observations: Sequence[Observation], seed: int = 0
    ) -> list[Reconstruction]:
        for obs in observations:
            require_replayable(obs, "fedavg-leakage")
        return super().reconstruct_many(observations, seed)

    @staticmethod
    def distance(
        dummy: list[torch.Tensor], target: list[torch.Tensor], constants: list[torch.Tensor]
    ) -> torch.Tensor:
        """``sum_l ||u'_l - u_l||^2 / sum_l ||u_l||^2`` (scale-free, so the priors' weights are)."""
        difference = torch.stack(
            [(d - t).square().sum() for d, t in zip(dummy, target, strict=True)]
        )
        scale = torch.stack([t.square().sum() for t in target]).sum()
        return difference.sum() / (scale + torch.finfo(scale.dtype).tiny)

    def dummy_copies(self, observation: Observation) -> int:
        return LocalSchedule.of(observation).epochs

    def victim_extras(
        self, observation: Observation, labels: torch.Tensor | None, seed: int
    ) -> dict[str, torch.Tensor]:
        """The label counts read from the update (what every epoch's soft labels sum to)."""
        if self.params.label_count_weight == 0 or self.params.labels == "infer":
            return {}
        found = infer_labels(observation, self.device, self.params.batch_labels)
        counts = torch.bincount(found, minlength=observation.input_spec.num_classes)
        return {"label-counts": counts.float()}

    def simulated_gradient(
        self,
        problem: MatchingProblem,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        functional: bool,
    ) -> list[torch.Tensor]:
        """The replayed local training, each epoch on its own dummies."""
        return replay_local_training(problem, params, x, y, self.params.adam_smoothing)

    def extra_objective(
        self,
        problem: MatchingProblem,
        params: dict[str, torch.Tensor],
        extras: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> torch.Tensor | None:
        """The order-invariant epoch prior and the label-count prior."""
        examples = problem.schedule.num_examples
        copies = x.reshape(len(x) // examples, examples, -1)
        value = torch.zeros((), device=x.device)
        if len(copies) > 1 and self.params.epoch_prior:
            tied = torch.stack([chamfer(c, copies[0]) for c in copies[1:]]).sum()
            value = value + self.params.epoch_prior * tied
        if "label-counts" in extras:
            totals = y.reshape(len(copies), examples, -1).sum(dim=1)
            miss = (totals - extras["label-counts"]).square().sum() / examples**2
            value = value + self.params.label_count_weight * miss
        return value

    def merge_copies(
        self, x: torch.Tensor, label_scores: torch.Tensor, examples: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every epoch's copy matched to the first (Hungarian on MSE), then averaged."""
        if len(x) == examples:
            return x, label_scores
        images = x.reshape(len(x) // examples, examples, *x.shape[1:])
        scores = label_scores.reshape(len(images), examples, -1)
        first = images[0].flatten(1)
        merged_x, merged_y = [images[0]], [scores[0]]
        for copy, score in zip(images[1:], scores[1:], strict=True):
            cost = torch.cdist(first, copy.flatten(1)).square().cpu().numpy()
            _, order = linear_sum_assignment(cost)
            index = torch.as_tensor(order, device=x.device)
            merged_x.append(copy[index])
            merged_y.append(score[index])
        return torch.stack(merged_x).mean(dim=0), torch.stack(merged_y).mean(dim=0)
