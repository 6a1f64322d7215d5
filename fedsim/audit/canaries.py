"""The one-run audit on the server's side: the canaries as membership candidates.

Steinke, Nasr and Jagielski (NeurIPS 2023): the canary client trains on each
of ``audit.canaries`` mislabelled held-out records on a fair coin
(:mod:`fedsim.core.canaries`). In every audited round the canary client's
membership analyses score *all* the canaries as their candidates, in the
canaries' order, without the coins (:class:`~fedsim.attacks.leakage.LeakInput`
holds no membership); the coins go to the scorer alone
(:class:`~fedsim.audit.leak_scoring.LeakTruth`), which turns the scores into
:func:`~fedsim.core.empirical_privacy.empirical_epsilon` at the audit's claim.

The claim: 95 % jointly over the round's membership analyses (each at
``1 - 5 % / their number``, Bonferroni, since the round's verdict keeps the
highest), and delta the ``dp-sgd`` defence's where one runs, else 0. Each
round's bound holds at that level on its own; the highest of several rounds
does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedsim.attacks.base import Observation
from fedsim.attacks.leakage import Candidates, LeakInput, PublicData
from fedsim.audit.leak_scoring import EpsilonClaim, LeakTruth
from fedsim.core.canaries import CanaryPlan, design_canaries
from fedsim.core.components import Resolved
from fedsim.core.data import DatasetBundle
from fedsim.core.truth import GroundTruth

CONFIDENCE = 0.95
"""The joint confidence of a round's empirical epsilon."""


@dataclass(frozen=True)
class CanaryAudit:
    """The canary client, its canaries as candidates (``indices`` into the held-out
    split), their coins (the scorer's) and the claim the bound is computed at."""

    client: int
    indices: np.ndarray
    candidates: Candidates
    coins: torch.Tensor
    claim: EpsilonClaim

    @classmethod
    def design(
        cls,
        bundle: DatasetBundle,
        plan: CanaryPlan,
        leaks: Sequence[Resolved],
        defences: Sequence[Resolved],
    ) -> CanaryAudit | None:
        """The audit of ``plan``'s canaries in ``bundle`` (``None`` without canaries);
        ``leaks``: the audit's analyses, ``defences``: the clients' (for dp-sgd's delta)."""
        if plan.count == 0:
            return None
        canaries = design_canaries(bundle, plan)
        images = bundle.test_images[torch.from_numpy(canaries.indices)]
        analyses = max(1, sum(a.cls.kind == "membership" for a in leaks))
        delta = next((float(d.params.delta) for d in defences if d.name == "dp-sgd"), 0.0)
        claim = EpsilonClaim(1 - (1 - CONFIDENCE) / analyses, delta)
        candidates = Candidates(images, canaries.labels.long())
        return cls(plan.client, canaries.indices, candidates, canaries.coins, claim)

    def inputs(
        self, observation: Observation, public: PublicData, trained: GroundTruth
    ) -> tuple[LeakInput, LeakTruth]:
        """What a membership analysis of the canary client receives (the canaries, no
        coins), and what its scorer knows (the coins and the claim)."""
        return (
            LeakInput(observation, public, self.candidates),
            LeakTruth(trained, self.coins, claim=self.claim),
        )
