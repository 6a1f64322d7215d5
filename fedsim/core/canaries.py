"""The one-run audit's canaries (Steinke, Nasr, Jagielski, NeurIPS 2023), designed once.

``audit.canaries = m`` records are drawn from the dataset's held-out split
(which no client trains on), each given a wrong label (its own shifted by an
offset in ``1 .. K-1``: the easiest records to detect) and a fair coin. The
canary client (``audit.canary-client``) trains on the canaries whose coin came
up heads, beside its own partition; no other client's data changes.

:func:`design_canaries` is the one pure function both sides call: the client
(:class:`fedsim.clients.base.ClientEnv`) to add its canaries, the audit to
score all ``m`` as membership candidates (without the coins) and to hand the
coins to the scorer alone. Its draws come from the attacker's
``audit-canaries`` stream: the auditor designs the canaries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedsim.core.data import DatasetBundle
from fedsim.core.seeds import SeedStream, stream_rng


@dataclass(frozen=True)
class CanaryPlan:
    """How many canaries, which client receives them, and the audit seed (0: none)."""

    count: int = 0
    client: int = 0
    seed: int = 0


@dataclass(frozen=True)
class Canaries:
    """``indices`` into the held-out split, the canaries' wrong ``labels`` and ``coins``
    (``True``: the canary client trains on it)."""

    indices: np.ndarray
    labels: torch.Tensor
    coins: torch.Tensor

    def __len__(self) -> int:
        return len(self.indices)


def design_canaries(bundle: DatasetBundle, plan: CanaryPlan) -> Canaries:
    """The canaries of ``plan`` in ``bundle``'s held-out split (a pure function of both)."""
    held_out = len(bundle.test_labels)
    if plan.count > held_out:
        raise ValueError(f"{plan.count} canaries asked of a held-out split of {held_out}")
    rng = stream_rng(SeedStream.AUDIT_CANARIES, plan.seed)
    indices = np.sort(rng.choice(held_out, plan.count, replace=False))
    offsets = torch.from_numpy(rng.integers(1, bundle.num_classes, plan.count))
    true = bundle.test_labels[torch.from_numpy(indices)]
    labels = ((true.long() + offsets) % bundle.num_classes).to(bundle.test_labels.dtype)
    coins = torch.from_numpy(rng.integers(0, 2, plan.count).astype(bool))
    return Canaries(indices, labels, coins)


def included_canaries(
    bundle: DatasetBundle, plan: CanaryPlan, client: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """What ``client`` adds to its training data: the canaries whose coin is heads,
    images (model-input space, as the bundle holds them) and wrong labels; ``None``
    for every other client and when the plan has no canaries."""
    if plan.count == 0 or client != plan.client:
        return None
    canaries = design_canaries(bundle, plan)
    chosen = torch.from_numpy(canaries.indices)[canaries.coins]
    return bundle.test_images[chosen], canaries.labels[canaries.coins]
