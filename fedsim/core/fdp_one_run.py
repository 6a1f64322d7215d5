"""An f-DP lower bound from one run (Mahloujifar, Melis, Chaudhuri, ICML 2025).

The same game as :mod:`fedsim.core.empirical_privacy` (Steinke, Nasr, Jagielski):
``m`` canaries on independent fair coins, an auditor guessing "in" for its
highest scores and "out" for its lowest, ``k`` guesses of which ``c`` are right.
Instead of an ``(epsilon, delta)`` claim, the null hypothesis is a whole
trade-off curve: the run is ``mu``-GDP, ``f = G_mu``, whose "blow-up"
``1 - f(x) = Phi(Phi^-1(x) + mu)`` bounds the power of any test at level ``x``.

The bound. With ``J`` a canary drawn uniformly, ``C`` the right guesses, ``p_j =
P[C = j]``, ``r_i = P[J guessed right, C >= i] = sum_{j >= i} p_j j / m`` and
``h_i = P[J guessed wrong, C >= i] = sum_{j >= i} p_j (k - j) / m``, flipping
``J``'s coin turns a right guess into a wrong one and ``C`` into ``C - 1``, so
f-DP for each canary and the concavity of ``1 - f`` give
``r_{i+1} <= 1 - f(h_i)`` for every ``i``. Suppose ``P[C >= c] >= tau``; start
from the least mass that allows it, all at ``c`` (``r = tau c / m``, ``h = tau
(k - c) / m``), and walk ``i = c - 1, ..., 0``: ``h_i`` must be at least the
blow-up's inverse at ``r_{i+1}``, and the mass that adds at ``C = i`` raises
``r`` by ``i / (k - i)`` times what it adds to ``h``. Every distribution of ``C``
has ``r_0 + h_0 = k / m``; if the walk ends above it, ``P[C >= c] < tau`` under
the claim and ``c`` right guesses reject it at level ``tau``. This is the
authors' ``audit_rh_with_cap`` with a two-letter alphabet (in or out), written here
from the argument above; ``tests/test_fdp_one_run.py`` checks its verdicts against a
linear programme over the distribution of ``C`` under the same constraints (the
curve relaxed to its tangents), which agreed on every case tried.

The estimate is the largest ``mu`` that ``c`` rejects at ``1 - confidence`` (0
when none is), and the epsilon at ``delta`` of ``mu``-GDP (Dong, Roth, Su 2022,
Corollary 2.13; :func:`~fedsim.core.empirical_privacy.gaussian_mechanism_epsilon`).
That epsilon is a lower bound *within the Gaussian family*: a run that is not
``mu``-GDP may still be ``(epsilon, delta)``-DP at the reported epsilon when its
trade-off curve is not Gaussian, which Steinke et al.'s bound does not assume.

Where fedsim departs from the authors' code (facebookresearch/PrivacyGuard,
``FDPAnalysisNode``): it scans a grid of noise levels for one fixed split of the
guesses; fedsim root-finds ``mu`` and takes the best of the same few splits as
:func:`~fedsim.core.empirical_privacy.empirical_epsilon` with the level divided
among them (Bonferroni), so that both estimates read the same guesses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import ndtr, ndtri

from fedsim.core.config import require
from fedsim.core.empirical_privacy import (
    DEFAULT_SPLITS,
    Guesses,
    gaussian_mechanism_epsilon,
    splits,
)

MU_CAP = 40.0
"""Beyond this ``mu`` the bound is reported as this (its epsilon is capped at
:data:`~fedsim.core.empirical_privacy.EPSILON_CAP` already: at delta 1e-5 from mu 6.68)."""

DEFAULT_DELTA = 1e-5
"""The delta at which ``mu`` is turned into epsilon where the run has none: every
``mu > 0`` is epsilon infinity at delta 0."""


def blow_up_inverse(mu: float, power: float) -> float:
    """The least level at which a test can reach ``power`` against ``mu``-GDP:
    ``Phi(Phi^-1(power) - mu)``, the inverse of ``1 - G_mu``."""
    return float(ndtr(ndtri(min(power, 1.0)) - mu))


def excess(found: Guesses, mu: float, significance: float) -> float:
    """How far ``r_0 + h_0`` must pass ``k / m`` for ``P[C >= c] >= significance`` under
    ``mu``-GDP (the module's walk): above 0, ``found`` rejects ``mu`` at ``significance``."""
    m, k, c = found.canaries, found.guesses, found.correct
    right, wrong = significance * c / m, significance * (k - c) / m
    for i in range(c - 1, -1, -1):
        needed = blow_up_inverse(mu, right)
        if needed <= wrong:
            break  # neither changes again
        right = min(right + i / (k - i) * (needed - wrong), 1.0)
        wrong = needed
    return right + wrong - k / m


def largest_mu(found: Guesses, significance: float) -> float:
    """The largest ``mu`` whose ``mu``-GDP claim ``found`` rejects at ``significance``;
    0 when even ``mu = 0`` stands."""
    if excess(found, 0.0, significance) <= 0:
        return 0.0
    if excess(found, MU_CAP, significance) > 0:
        return MU_CAP
    return float(brentq(lambda mu: excess(found, mu, significance), 0.0, MU_CAP, xtol=1e-6))


@dataclass(frozen=True)
class FdpEpsilon:
    """The f-DP bound: ``mu``, its epsilon at ``delta``, the split that gave it and the
    level it holds at."""

    mu: float
    epsilon: float
    confidence: float
    delta: float
    guesses: Guesses
    splits_tried: int


def fdp_epsilon(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    confidence: float = 0.95,
    delta: float = DEFAULT_DELTA,
    shares: Sequence[float] = DEFAULT_SPLITS,
) -> FdpEpsilon:
    """The one-run lower bound on ``mu`` (Gaussian DP) from every canary's score and coin,
    and its epsilon at ``delta``; the best over ``shares``, each at significance
    ``(1 - confidence) / len(shares)``, as :func:`empirical_epsilon`."""
    require(0 < delta < 1, "delta", delta, "must be in (0, 1) (mu-GDP at delta 0 is unbounded)")
    found, significance = splits(scores, included, confidence, delta, shares)
    mu, best = max(((largest_mu(g, significance), g) for g in found), key=lambda b: b[0])
    epsilon = gaussian_mechanism_epsilon(mu, delta)
    return FdpEpsilon(mu, epsilon, confidence, delta, best, len(shares))
