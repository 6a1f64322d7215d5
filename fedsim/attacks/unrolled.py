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
from typing import Any

import torch
from torch.func import functional_call

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import Observation, Reconstruction
from fedsim.attacks.dlg import DLG
from fedsim.attacks.gradients import local_steps_taken, soft_cross_entropy
from fedsim.attacks.matching import _Group


@ATTACKS.register("unrolled-dlg")
class UnrolledDLG(DLG):
    """DLG matching a replayed multi-step local SGD update."""

    _schedule: tuple[float, int, int] = (0.0, 1, 1)  # lr, steps, batch size

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

    def _build_group(self, observations: Sequence[Observation], seed: int) -> _Group:
        first = observations[0]
        cfg = first.train_config
        self._schedule = (cfg.lr, local_steps_taken(first), cfg.batch_size)
        return super()._build_group(observations, seed)

    def _problem_distance(self, group: _Group, transform: bool) -> Any:
        model, names = group.model, group.names
        lr, steps, batch = self._schedule

        def loss(shared, fixed, x, y):
            return soft_cross_entropy(functional_call(model, {**fixed, **shared}, (x,)), y)

        def problem(params, target, constants, x, y):
            start = {n: params[n] for n in names}
            fixed = {n: p for n, p in params.items() if n not in start}
            weights = start
            for step in range(steps):
                lo = (step * batch) % len(x)
                grads = torch.func.grad(loss)(
                    weights, fixed, x[lo : lo + batch], y[lo : lo + batch]
                )
                weights = {n: weights[n] - lr * grads[n] for n in names}
            simulated = [(start[n] - weights[n]) / (lr * steps) for n in names]
            return self.distance(simulated, target, constants)

        return problem
