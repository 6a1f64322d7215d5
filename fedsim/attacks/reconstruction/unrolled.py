"""DLG on a multi-step update, by unrolling the client's local training.

With one local SGD step an update is exactly ``lr`` times a gradient. With
several, reading the update as one large-batch step is only an
approximation; instead (as Geiping et al. 2020) the attacker replays the
client's local training on the dummy batch in autograd, with the schedule the
server sent (lr, batch size, steps, FedProx's mu), and matches the simulated
update ``(w_global - w_K(x~)) / (lr K)`` to the observed one
(:func:`~fedsim.attacks.toolkits.matching_problem.replay_local_training`; images are learnt
into whichever batch slot fits): SGD with or without momentum and weight
decay, Adam and AdamW from a fresh state (:mod:`fedsim.attacks.toolkits.replay` states
the threat model). Every epoch reuses the same dummy slots, as if the client
never reshuffled; ``fedavg-leakage`` gives each epoch its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsim.attacks.base import AttackSetting, Observation, Reconstruction
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.dlg_matching import DLGMatching
from fedsim.attacks.toolkits.matching_problem import (
    MatchingProblem,
    replay_local_training,
    require_replayable,
)
from fedsim.attacks.toolkits.replay import check_replayable_setting
from fedsim.core.threat import ONE_UPDATE


@ATTACKS.register("unrolled-dlg")
class UnrolledDLG(DLGMatching):
    """DLG matching a replayed multi-step local SGD update."""

    threat_models = ONE_UPDATE  # a probe is a gradient, an aggregate several updates

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Updates only (a probe is a gradient: there is nothing to replay) that can be replayed."""
        check_replayable_setting(setting, key, "unrolled-dlg")

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
        """``(w_global - w_K) / (lr K)`` after replaying the client's ``K`` local steps."""
        return replay_local_training(problem, params, x, y)
