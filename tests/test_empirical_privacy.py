"""The one-run epsilon lower bound (Steinke et al. 2023) against mechanisms of known epsilon."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logit
from scipy.stats import beta

from fedsim.core.config import ScenarioError
from fedsim.core.empirical_privacy import Guesses, empirical_epsilon, guesses


def randomized_response(epsilon: float, canaries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Coins, and scores from the best attack on an epsilon-DP randomized response of
    each coin (the report is right with probability e^eps / (1 + e^eps)): the tightest
    case, where the bound should come close to epsilon without passing it."""
    rng = np.random.default_rng(seed)
    coins = rng.random(canaries) < 0.5
    truthful = rng.random(canaries) < np.exp(epsilon) / (1 + np.exp(epsilon))
    reports = np.where(truthful, coins, ~coins)
    return reports.astype(float) + 1e-3 * rng.random(canaries), coins  # ties broken at random


def test_with_no_delta_the_bound_is_the_clopper_pearson_limit_in_log_odds() -> None:
    found = Guesses(canaries=1000, guesses=200, correct=170)
    # P[Bin(r, q) >= v] = significance  <=>  q = the Beta(v, r - v + 1) quantile.
    q = beta.ppf(0.05, 170, 200 - 170 + 1)

    assert found.epsilon(0.05) == pytest.approx(float(logit(q)), abs=1e-5)
    assert Guesses(1000, 200, 100).epsilon(0.05) == 0.0  # chance: nothing rejected


def test_delta_only_weakens_the_bound_and_the_p_value_grows_with_epsilon() -> None:
    found = Guesses(canaries=1000, guesses=100, correct=95)
    values = [found.p_value(e, 1e-5) for e in np.linspace(0, 5, 11)]

    assert values == sorted(values)
    assert found.epsilon(0.05, delta=1e-5) < found.epsilon(0.05)
    assert found.epsilon(0.05, delta=1e-5) > 1.0


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 4.0])
def test_on_randomized_response_the_bound_holds_and_comes_close(epsilon: float) -> None:
    # 40 runs of 1,000 canaries each; at 95 % confidence about 5 % may pass epsilon.
    # Measured: 1 of 40 passed at each epsilon (0.583 / 2.041 / 4.075); median bounds
    # 0.268 / 1.697 / 3.293 for epsilon 0.5 / 2 / 4.
    bounds = [
        empirical_epsilon(*randomized_response(epsilon, 1000, seed)).epsilon for seed in range(40)
    ]

    assert sum(b > epsilon for b in bounds) <= 2
    assert np.median(bounds) > 0.45 * epsilon


def test_scores_that_ignore_the_coins_give_zero_in_almost_every_run() -> None:
    rng = np.random.default_rng(0)
    bounds = [empirical_epsilon(rng.random(500), rng.random(500) < 0.5).epsilon for _ in range(40)]

    assert sum(b > 0 for b in bounds) <= 2  # the null: a 5 % level over 40 runs


def test_guesses_count_the_right_ones_at_both_ends() -> None:
    scores = np.array([0.9, 0.8, 0.1, 0.2, 0.5])
    coins = np.array([True, False, False, True, True])

    found = guesses(scores, coins, guess_in=2, guess_out=2)

    # "in": 0.9 (right), 0.8 (wrong); "out": 0.1 (right), 0.2 (wrong).
    assert (found.guesses, found.correct) == (4, 2)


def test_bad_input_is_refused_in_one_line() -> None:
    with pytest.raises(ScenarioError, match="one score and one coin per canary"):
        empirical_epsilon([0.1, 0.2], [True])
    with pytest.raises(ScenarioError, match="confidence"):
        empirical_epsilon([0.1, 0.2], [True, False], confidence=1.0)
    with pytest.raises(ScenarioError, match="k\\+ \\+ k- <= 2"):
        guesses(np.array([0.1, 0.2]), np.array([True, False]), 2, 1)
