"""DLG on a multi-step update, by unrolling the client's local training.

With one local SGD step an update is exactly ``lr`` times a gradient. With
several, reading the update as one large-batch step is only an
approximation; instead (as Geiping et al. 2020) the attacker replays the
client's local training on the dummy batch in autograd, with the schedule the
server sent (lr, batch size, steps, FedProx's mu), and matches the simulated
update ``(w_global - w_K(x~)) / (lr K)`` to the observed one
(:func:`~fedsim.attacks.matching.replay_local_training`; images are learnt
into whichever batch slot fits). Plain SGD only (no momentum or weight decay).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsim.attacks.base import AttackSetting, Observation, Reconstruction
from fedsim.attacks.dlg import DLG
from fedsim.attacks.matching import (
    MatchingProblem,
    replay_local_training,
    require_replayable,
)
from fedsim.attacks.registry import ATTACKS
from fedsim.core.config import require


@ATTACKS.register("unrolled-dlg")
class UnrolledDLG(DLG):
    """DLG matching a replayed multi-step local SGD update."""

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Updates only (a probe is a gradient: there is nothing to replay), from plain SGD."""
        cfg = setting.client
        require(
            setting.threat_model == "update",
            f"{key}.name",
            "unrolled-dlg",
            "replays client updates; "
            f'audit.threat-model = "{setting.threat_model}" gives gradients',
        )
        require(
            cfg.optimizer == "sgd" and not cfg.momentum and not cfg.weight_decay,
            f"{key}.name",
            "unrolled-dlg",
            "replays plain SGD; the clients use "
            f"client.optimizer = {cfg.optimizer!r}, momentum {cfg.momentum}, "
            f"weight-decay {cfg.weight_decay}",
        )

    def reconstruct_many(
        self, observations: Sequence[Observation], seed: int = 0
    ) -> list[Reconstruction]:
        for obs in observations:
            require_replayable(obs, "unrolled-dlg")
        return super().reconstruct_many(observations, seed)

    def simulated_gradient(
        self,
        problem: MatchingProblem,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        functional: bool,
    ) -> list[torch.Tensor]:
        """``(w_global - w_K) / (lr K)`` after replaying the client's ``K`` SGD steps."""
        return replay_local_training(problem, params, x, y)
