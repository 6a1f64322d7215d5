"""Inverting Gradients (Geiping et al. 2020): cosine matching, a TV prior, signed Adam.

The attack minimises

    1 - cos(g(x'), g) + alpha * TV(x')

over dummy images ``x'`` boxed into the valid pixel range, with labels read
from the last layer first (iDLG at batch 1, counting for batches). The
cosine is taken, as in the authors' code (``inversefed``'s ``sim`` cost),
over all matched layers at once with optional per-layer weights
(``cosine = "joint"``); ``"per-layer"`` sums ``w_l (1 - cos_l)`` instead.
Adam (lr 0.1) steps on the sign of the objective's gradient; the learning
rate drops tenfold at 3/8, 5/8 and 7/8 of the iterations. Restarts are
batched like every matching attack and each victim keeps the one with the
lowest final objective.

Against a multi-step update (several local steps or epochs) the attack
replays the client's local SGD from the sent config
(:func:`~fedsim.attacks.toolkits.matching_problem.replay_local_training`, shared with
``unrolled-dlg``), as the paper's FedAvg experiments do.

Defaults follow ``inversefed`` on CIFAR: 4,800 iterations, TV weight 1e-1
(TV = mean |dx| + mean |dy| of the normalised image), equal layer weights,
one restart per default run of the paper, four here (restarts are cheap when
batched and the attacker may pick by objective).
"""

from __future__ import annotations

from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.ig_matching import IGMatching, total_variation
from fedsim.core.params.matching import InvertingGradientsParams

__all__ = ["InvertingGradients", "InvertingGradientsParams", "total_variation"]


@ATTACKS.register("inverting-gradients", aliases=("ig",))
class InvertingGradients(IGMatching):
    """Geiping et al.'s attack: cosine gradient matching with a TV prior."""
