"""DLG on a multi-step update, by unrolling the client's local training.

With one local SGD step an update is exactly ``lr`` times a gradient. With
several, reading the update as one large-batch step is only an
approximation; instead (as Geiping et al. 2020) the attacker replays the
client's local training on the dummy batch in autograd, with the schedule the
server sent (lr, batch size, steps), and matches the simulated update
``(w_global - w_K(x~)) / (lr K)`` to the observed one. The client's batch
order is private: dummy images ``[kB, (k+1)B)`` form step ``k`` (images are
learnt into whichever slot fits). Plain SGD only (no momentum or weight decay).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import Observation, Reconstruction
from fedsim.attacks.dlg import DLG
from fedsim.attacks.matching import MatchingProblem, model_loss


@ATTACKS.register("unrolled-dlg")
class UnrolledDLG(DLG):
    """DLG matching a replayed multi-step local SGD update."""

    def reconstruct_many(
        self, observations: Sequence[Observation], seed: int = 0
    ) -> list[Reconstruction]:
        for obs in observations:
            cfg = obs.train_config
            if obs.shared_kind != "update":
                raise ValueError("unrolled-dlg attacks updates; use dlg on gradients")
            if cfg.optimizer != "sgd" or cfg.momentum or cfg.weight_decay:
                raise ValueError(
                    "unrolled-dlg replays plain SGD; the client used "
                    f"optimizer={cfg.optimizer!r}, momentum={cfg.momentum}, "
                    f"weight-decay={cfg.weight_decay}"
                )
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
        names, schedule = problem.names, problem.schedule
        lr, batch = schedule.lr, schedule.batch_size
        start = {n: params[n] for n in names}
        fixed = {n: p for n, p in params.items() if n not in start}
        grad = torch.func.grad(model_loss(problem.model))
        weights = start
        for step in range(schedule.steps):
            lo = (step * batch) % len(x)
            grads = grad(weights, fixed, x[lo : lo + batch], y[lo : lo + batch])
            weights = {n: weights[n] - lr * grads[n] for n in names}
        return [(start[n] - weights[n]) / (lr * schedule.steps) for n in names]
