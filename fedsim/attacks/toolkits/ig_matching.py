"""Inverting Gradients' objective on the gradient-matching loop, which ``inverting-gradients``
and its variants share.

:class:`IGMatching` is Inverting Gradients (Geiping et al. 2020;
:mod:`fedsim.attacks.reconstruction.ig` states the method) unregistered: the cosine
distance with its layer weights, the TV prior, the replay of a multi-step update, its
settings (:class:`InvertingGradientsParams`) and step caps. ``inverting-gradients``
registers it as it is; ``ig-defence-aware`` extends it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedsim.attacks.base import AttackSetting, Observation, Reconstruction
from fedsim.attacks.presets import StepCaps
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.gradients import local_steps_taken
from fedsim.attacks.toolkits.matching import GradientMatchingAttack
from fedsim.attacks.toolkits.matching_problem import (
    MatchingProblem,
    replay_local_training,
    require_replayable,
)
from fedsim.attacks.toolkits.replay import replays_updates
from fedsim.core.params.matching import InvertingGradientsParams
from fedsim.core.threat import SharedKind


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of neighbouring pixels, across and down (``inversefed``'s TV)."""
    across = (x[..., :, 1:] - x[..., :, :-1]).abs().mean()
    down = (x[..., 1:, :] - x[..., :-1, :]).abs().mean()
    return across + down


class IGMatching(GradientMatchingAttack):
    """Inverting Gradients' cosine distance, TV prior and replay; its variants extend it."""

    Params = InvertingGradientsParams
    params: InvertingGradientsParams
    step_caps = StepCaps(2000, resnet=1000, measured={"lenet5-split": 250, "lenet-zhu": 2000})

    @classmethod
    def audit_preset(cls, setting: AttackSetting) -> dict[str, Any]:
        """The step caps; it replays several local steps where the server can, else it
        reads an update as one large-batch gradient (as DLG does)."""
        return super().audit_preset(setting) | {"unroll": replays_updates(setting)}

    def reconstruct_many(
        self, observations: Sequence[Observation], seed: int = 0
    ) -> list[Reconstruction]:
        for obs in observations:
            if self._unrolls(obs.shared_kind, local_steps_taken(obs)):
                require_replayable(obs, ATTACKS.name_of(self))
        return super().reconstruct_many(observations, seed)

    def _unrolls(self, shared_kind: str, steps: int) -> bool:
        return self.params.unroll and shared_kind == SharedKind.UPDATE and steps > 1

    @staticmethod
    def distance(
        dummy: list[torch.Tensor], target: list[torch.Tensor], constants: list[torch.Tensor]
    ) -> torch.Tensor:
        """Weighted cosine distance; ``constants``: layer weights and the joint flag."""
        weights, joint = constants
        dots = torch.stack([(d * t).sum() for d, t in zip(dummy, target, strict=True)])
        dummy_sq = torch.stack([d.square().sum() for d in dummy])
        target_sq = torch.stack([t.square().sum() for t in target])
        # The tiny floor keeps an all-zero dummy gradient finite (cosine 0).
        tiny = torch.finfo(dots.dtype).tiny
        whole = 1 - (weights * dots).sum() / (
            (weights * dummy_sq).sum().sqrt() * (weights * target_sq).sum().sqrt() + tiny
        )
        per_layer = (weights * (1 - dots / (dummy_sq.sqrt() * target_sq.sqrt() + tiny))).sum()
        return torch.where(joint > 0, whole, per_layer)

    def distance_constants(
        self, target: list[torch.Tensor], depths: list[int]
    ) -> list[torch.Tensor]:
        """Per-tensor weights (in the order matched) and the joint-cosine flag."""
        count = len(target)
        if self.params.layer_weights == "linear":
            weights = torch.arange(count, 0, -1, dtype=torch.float32) / count
        else:
            weights = torch.ones(count)
        joint = torch.tensor(1.0 if self.params.cosine == "joint" else 0.0)
        return [weights.to(self.device), joint.to(self.device)]

    def simulated_gradient(
        self,
        problem: MatchingProblem,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        functional: bool,
    ) -> list[torch.Tensor]:
        """One gradient, or the replayed local training of a multi-step update."""
        if self._unrolls(problem.shared_kind, problem.schedule.steps):
            return replay_local_training(problem, params, x, y)
        return super().simulated_gradient(problem, params, x, y, functional)

    def extra_objective(
        self,
        problem: MatchingProblem,
        params: dict[str, torch.Tensor],
        extras: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> torch.Tensor | None:
        """``alpha * TV(x')`` on the dummy in model-input space."""
        if self.params.tv_weight == 0:
            return None
        return self.params.tv_weight * total_variation(x)
