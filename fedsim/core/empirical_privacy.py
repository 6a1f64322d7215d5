"""An empirical lower bound on epsilon from one run (Steinke, Nasr, Jagielski, NeurIPS 2023).

``m`` canaries are each included in the training data on an independent fair
coin. After the run an auditor scores every canary (higher: more likely
included), guesses "in" for its ``k+`` highest scores and "out" for its ``k-``
lowest, and abstains on the rest. If the training is ``(epsilon, delta)``-DP,
the number ``W`` of right guesses among the ``r = k+ + k-`` made satisfies
(their Theorem 5.2, with ``q = e^epsilon / (1 + e^epsilon)``)

    P[W >= v] <= P[Bin(r, q) >= v]
                 + 2 m delta max_{1 <= i <= v} (P[Bin(r, q) >= v - i] - P[Bin(r, q) >= v]) / i.

The right-hand side is the p-value of the claim "the run is
``(epsilon, delta)``-DP" given ``v``; it grows with ``epsilon``. The empirical
epsilon at confidence ``1 - beta`` is the largest epsilon whose claim the
observed ``v`` rejects at level ``beta`` (0 when none is): with probability at
least ``1 - beta`` over the coins it is at most the true epsilon, whatever the
scores. Choosing ``(k+, k-)`` after seeing the scores spends that level:
:func:`empirical_epsilon` tries a few splits and divides ``beta`` among them
(Bonferroni), so the bound stays valid.

This is the bound alone; which canaries and which scores feed it is the
caller's (fedsim's membership analyses give scores).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit
from scipy.stats import binom, norm

from fedsim.core.config import require

EPSILON_CAP = 50.0
"""Beyond this the bound is reported as this (a perfect auditor on many canaries)."""


@dataclass(frozen=True)
class Guesses:
    """What one split of the scores gave: canaries, guesses made and guesses right."""

    canaries: int
    guesses: int
    correct: int

    def __post_init__(self) -> None:
        require(self.canaries >= 1, "canaries", self.canaries, "must be >= 1")
        require(
            0 <= self.guesses <= self.canaries,
            "guesses",
            self.guesses,
            f"must be in [0, {self.canaries}] (the canaries)",
        )
        require(
            0 <= self.correct <= self.guesses,
            "correct",
            self.correct,
            f"must be in [0, {self.guesses}] (the guesses)",
        )

    def p_value(self, epsilon: float, delta: float = 0.0) -> float:
        """The bound on ``P[W >= correct]`` for an ``(epsilon, delta)``-DP run (Theorem 5.2)."""
        q = float(expit(epsilon))
        tail = float(binom.sf(self.correct - 1, self.guesses, q))
        if delta == 0 or self.correct == 0:
            return tail
        steps = np.arange(1, self.correct + 1)
        excess = binom.sf(self.correct - steps - 1, self.guesses, q) - tail
        return min(1.0, tail + 2 * self.canaries * delta * float(np.max(excess / steps)))

    def epsilon(self, significance: float, delta: float = 0.0) -> float:
        """The largest epsilon whose ``(epsilon, delta)`` claim these guesses reject at
        ``significance``; 0 when even epsilon = 0 stands."""
        if self.p_value(0.0, delta) > significance:
            return 0.0
        if self.p_value(EPSILON_CAP, delta) <= significance:
            return EPSILON_CAP
        return float(
            brentq(lambda e: self.p_value(e, delta) - significance, 0.0, EPSILON_CAP, xtol=1e-6)
        )


def guesses(scores: np.ndarray, included: np.ndarray, guess_in: int, guess_out: int) -> Guesses:
    """Guess "in" for the ``guess_in`` highest scores and "out" for the ``guess_out`` lowest.

    Ties are broken by position, which the coins do not depend on.
    """
    require(
        guess_in >= 0 and guess_out >= 0 and guess_in + guess_out <= len(scores),
        "guesses",
        (guess_in, guess_out),
        f"need 0 <= k+, k- and k+ + k- <= {len(scores)} (the canaries)",
    )
    order = np.argsort(-np.asarray(scores, dtype=float), kind="stable")
    chosen_in, chosen_out = order[:guess_in], order[len(order) - guess_out :]
    correct = int(included[chosen_in].sum()) + int((~included[chosen_out]).sum())
    return Guesses(len(scores), guess_in + guess_out, correct)


@dataclass(frozen=True)
class EmpiricalEpsilon:
    """The bound, the split that gave it and the level it holds at."""

    epsilon: float
    confidence: float
    delta: float
    guesses: Guesses
    splits_tried: int


DEFAULT_SPLITS = (0.02, 0.05, 0.1, 0.2, 0.5)
"""Shares of the canaries guessed, half "in" and half "out" (the paper varies ``k+ = k-``)."""


def splits(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    confidence: float,
    delta: float,
    shares: Sequence[float],
) -> tuple[list[Guesses], float]:
    """The guesses of each share in ``shares`` (``s m / 2`` canaries "in" and as many
    "out") and the significance each is tested at, ``(1 - confidence) / len(shares)``
    (Bonferroni), after checking the input."""
    score_array = np.asarray(scores, dtype=float)
    coins = np.asarray(included, dtype=bool)
    require(
        score_array.ndim == 1 and score_array.shape == coins.shape and len(coins) > 0,
        "scores",
        f"{score_array.shape} and {coins.shape}",
        "need one score and one coin per canary",
    )
    require(0 < confidence < 1, "confidence", confidence, "must be in (0, 1)")
    require(0 <= delta < 1, "delta", delta, "must be in [0, 1)")
    require(
        len(shares) > 0 and all(0 < s <= 1 for s in shares),
        "shares",
        tuple(shares),
        "need at least one share in (0, 1]",
    )
    found = []
    for share in shares:
        half = max(1, int(share * len(coins) / 2))
        found.append(guesses(score_array, coins, half, min(half, len(coins) - half)))
    return found, (1 - confidence) / len(shares)


def empirical_epsilon(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    confidence: float = 0.95,
    delta: float = 0.0,
    shares: Sequence[float] = DEFAULT_SPLITS,
) -> EmpiricalEpsilon:
    """The one-run lower bound on epsilon from every canary's score and coin.

    Each share ``s`` in ``shares`` guesses ``s m / 2`` canaries "in" and as many
    "out"; the best bound over the shares is reported, each computed at
    significance ``(1 - confidence) / len(shares)``.
    """
    found, significance = splits(scores, included, confidence, delta, shares)
    bound, best = max(((g.epsilon(significance, delta), g) for g in found), key=lambda b: b[0])
    return EmpiricalEpsilon(bound, confidence, delta, best, len(shares))


def gaussian_mechanism_delta(epsilon: float, separation: float) -> float:
    """The delta at which telling ``N(0, 1)`` from ``N(separation, 1)`` costs ``epsilon``
    (Balle and Wang, ICML 2018, Theorem 8: the Gaussian mechanism's exact privacy profile)."""
    if separation <= 0:
        return 0.0
    m = separation
    return float(norm.cdf(-epsilon / m + m / 2) - np.exp(epsilon) * norm.cdf(-epsilon / m - m / 2))


def gaussian_mechanism_epsilon(separation: float, delta: float) -> float:
    """The epsilon at ``delta`` of a Gaussian mechanism whose two outputs are ``separation``
    standard deviations apart (``EPSILON_CAP`` beyond it)."""
    if gaussian_mechanism_delta(0.0, separation) <= delta:
        return 0.0
    if gaussian_mechanism_delta(EPSILON_CAP, separation) > delta:
        return EPSILON_CAP
    return float(
        brentq(lambda e: gaussian_mechanism_delta(e, separation) - delta, 0.0, EPSILON_CAP)
    )


@dataclass(frozen=True)
class CosineEstimate:
    """Andrew et al.'s one-shot estimate from canary cosines, with a bootstrap interval."""

    epsilon: float
    low: float
    high: float
    delta: float
    # Inserted minus unseen mean cosine, in pooled standard deviations; at or below 0
    # the inserted canaries did not move the model towards them: epsilon 0.
    separation: float


def _separation(inserted: np.ndarray, unseen: np.ndarray) -> float:
    pooled = np.sqrt((inserted.var(ddof=1) + unseen.var(ddof=1)) / 2)
    return float((inserted.mean() - unseen.mean()) / pooled)


def cosine_epsilon(
    inserted: Sequence[float] | np.ndarray,
    unseen: Sequence[float] | np.ndarray,
    delta: float,
    rng: np.random.Generator,
    resamples: int = 1000,
) -> CosineEstimate:
    """User-level epsilon estimated from canary clients (Andrew et al., ICLR 2024).

    ``inserted``: the cosines between the final model's change and each inserted canary
    client's direction; ``unseen``: the same for directions never inserted. Both sets are
    fitted by Gaussians and the estimate is the epsilon at ``delta`` of telling them
    apart. One departure from the paper, which fits each set its own variance: one pooled
    variance (the Gaussian mechanism's shape, :func:`gaussian_mechanism_epsilon`), since
    with two fitted variances the privacy loss is unbounded and at a small delta the
    estimate follows the sampling noise in their ratio. An estimate, not a bound: the
    95 % interval (``low``, ``high``) resamples the canaries (``rng``: the auditor's).
    """
    seen, null = np.asarray(inserted, dtype=float), np.asarray(unseen, dtype=float)
    require(
        len(seen) >= 2 and len(null) >= 2,
        "canaries",
        (len(seen), len(null)),
        "need at least 2 inserted and 2 unseen canary cosines",
    )
    require(0 < delta < 1, "delta", delta, "must be in (0, 1)")
    separation = _separation(seen, null)
    draws = np.sort(
        [
            _separation(rng.choice(seen, len(seen)), rng.choice(null, len(null)))
            for _ in range(resamples)
        ]
    )
    low, high = (_epsilon_quantile(draws, q, delta) for q in (0.025, 0.975))
    epsilon = gaussian_mechanism_epsilon(separation, delta)
    return CosineEstimate(epsilon, low, high, delta, separation)


def _epsilon_quantile(separations: np.ndarray, q: float, delta: float) -> float:
    """The ``q`` quantile (NumPy's linear one) of the epsilons of sorted ``separations``.

    Epsilon rises with the separation, so the epsilons' order statistics are those of
    the separations: two root-finds around the quantile's position give what a
    root-find per resample would (1,000 of them per estimate before).
    """
    position = q * (len(separations) - 1)
    below = int(np.floor(position))
    above = min(below + 1, len(separations) - 1)
    low, high = (gaussian_mechanism_epsilon(float(separations[i]), delta) for i in (below, above))
    return low + (position - below) * (high - low)
