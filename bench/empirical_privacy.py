"""The accountant's epsilon (an upper bound) beside an empirical one, record and user level.

**User level** (``--level user``): Flower's central DP with client-side clipping
(:mod:`fedsim.strategies.central_dp`) around FedAvg, 4 real clients of embedded MNIST
(25 digits each, one local epoch of SGD, ``mlp-2nn``) and Andrew et al.'s canary clients
(:mod:`fedsim.audit.canary_clients`: ``--canaries`` inserted in every round, as many
unseen), for ``--rounds`` rounds at each central noise multiplier. The real clients'
replies come from fedsim's ClientApp (Flower's ``fixedclipping_mod`` inside); the
canaries' go into the same Flower wrapper, which noises the mean of all ``4 + k``. Per
row: Flower's RDP accountant's user-level epsilon, the canaries' estimate with its 95 %
bootstrap interval (an estimate, not a bound), and the exact epsilon of ``T`` composed
Gaussian releases at noise ``z`` (``sqrt(T) / z`` standard deviations apart), which the
estimate approaches when the canaries' cosines are Gaussian.

**Record level** (``--level record``): Steinke et al.'s one-run lower bound from the
audit's canaries (:mod:`fedsim.audit.canaries`, 100 mislabelled canaries in client 0's
data on fair coins, scored by ``loss-drop``) and the f-DP one-run bound on the same scores
(:mod:`fedsim.core.fdp_one_run`, Mahloujifar et al.) beside DP-SGD's accountant (Opacus),
on the setting of ``tests/test_canaries.py``: 2 clients of 20 digits, ``lenet5-split``,
Adam 3e-3, 60 local epochs, one round, a real Flower simulation on Ray per row. Both
bounds at the run's delta (1e-5 under DP-SGD); without DP-SGD Steinke et al.'s is at
delta 0 and the f-DP one at 1e-5 (every mu > 0 is epsilon infinity at delta 0).

**Gaussian mechanism** (``--level gaussian``, no training): ``--gaussian-canaries``
canaries whose scores are drawn from N(mu, 1) if included and N(0, 1) if not, so the
scores are exactly mu-GDP; both bounds at delta 1e-5 beside that mechanism's exact
epsilon (where an accountant would sit if it were tight)::

    .venv/bin/python bench/empirical_privacy.py [--level all] [--seeds 0 1 2] [--out FILE]

Measured (commit 771fd53's code, 2 cores, load 2.4-3.8 beside one other job; tables and what
they say in docs/leaks.md): user level at noise 0.5 / 1 / 2 / 4, accountant 30.1 / 12.3 /
5.38 / 2.45, exact Gaussian 28.4 / 11.5 / 4.98 / 2.26, canary estimates 28.3-29.6 /
11.5-12.7 / 4.91-5.97 / 2.14-3.11 over seeds 0-2; record level, no defence 1.68-2.34, DP-SGD
0.5 / 1 / 2 (accountant 149-164 / 40.6-45.1 / 14.4-16.0) 0 on every seed. The f-DP bound
(commit 6a11afa, load 4-6): no defence 2.99 / 4.31 / 3.50 on seeds 0-2 (at delta 1e-5),
DP-SGD 0.1 / 0.25 / 0.5 / 1 / 2 0 on every seed, as Steinke et al.'s; Gaussian, 1,000
canaries, mu 0.5 / 1 / 2 / 4: Steinke 0.37-0.84 / 1.64-1.69 / 2.99-3.70 / 4.62, f-DP
0.52-1.05 / 2.21-2.38 / 4.46-5.88 / 7.97, exact 1.99 / 4.38 / 10.0 / 24.4.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console

from fedsim.core import protocol
from fedsim.core.config import Scenario
from fedsim.core.empirical_privacy import empirical_epsilon, gaussian_mechanism_epsilon
from fedsim.core.fdp_one_run import fdp_epsilon
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.outputs.run_folder import METRICS_FILE
from fedsim.scenario.validate import validate
from fedsim.simulation.canary_run import run_with_canary_clients
from fedsim.simulation.runner import run_scenario

CLIENTS = 4
CLIP = 0.5
DELTA = 1e-5


def _user_scenario(seed: int, noise: float, rounds: int) -> Scenario:
    return scenario_from_dict(
        {
            "name": "user-level",
            "federation": {"num-clients": CLIENTS, "rounds": rounds, "seed": seed},
            "data": {"dataset": "mnist-embedded", "image-size": 28, "samples-per-client": 31},
            "model": {"name": "mlp-2nn"},
            "client": {"local-epochs": 1, "batch-size": 5, "optimizer": "sgd", "lr": 0.05},
            "central-dp": {"clipping": "client", "noise-multiplier": noise, "clipping-norm": CLIP},
            "audit": {"seed": seed},  # the canaries' directions and the bootstrap
        }
    )


def user_level(seed: int, noise: float, rounds: int, canaries: int) -> dict[str, Any]:
    """One federation with ``canaries`` canary clients under central DP at ``noise``."""
    start = time.perf_counter()
    run = run_with_canary_clients(validate(_user_scenario(seed, noise, rounds)), canaries)
    estimate = run.estimate
    return {
        "seed": seed,
        "noise": noise,
        "accountant": run.accountant,
        "exact-gaussian": gaussian_mechanism_epsilon(math.sqrt(rounds) / noise, DELTA),
        "estimate": estimate.epsilon,
        "low": estimate.low,
        "high": estimate.high,
        "separation": estimate.separation,
        "test-acc": run.test_acc,
        "seconds": time.perf_counter() - start,
    }


def record_level(seed: int, noise: float) -> dict[str, Any]:
    """One round of the canary client's 60 epochs, DP-SGD at ``noise`` (0: no defence)."""
    start = time.perf_counter()
    table: dict[str, Any] = {
        "name": "record-level",
        "federation": {"num-clients": 2, "rounds": 1, "seed": seed},
        "data": {"dataset": "mnist-embedded", "samples-per-client": 20, "normalize": True},
        "model": {"name": "lenet5-split"},
        "client": {"local-epochs": 60, "batch-size": 16, "optimizer": "adam", "lr": 0.003},
        "audit": {
            "enabled": True,
            "attacks": [],
            "leaks": [{"name": "loss-drop"}],
            "canaries": 100,
            "canary-client": 0,
            "seed": seed,
        },
    }
    if noise > 0:
        table["defences"] = [
            {"name": "dp-sgd", "noise-multiplier": noise, "max-grad-norm": 1.0, "delta": DELTA}
        ]
    with tempfile.TemporaryDirectory() as out:
        run_scenario(scenario_from_dict(table), Path(out) / "run", console=Console(quiet=True))
        last = pd.read_csv(Path(out) / "run" / METRICS_FILE).iloc[-1]
    return {
        "seed": seed,
        "noise": noise,
        "accountant": float(last.get(protocol.DP_EPSILON, math.inf)),
        "steinke": float(last[protocol.AUDIT_EPSILON_EMPIRICAL]),
        "f-dp": float(last[protocol.AUDIT_EPSILON_EMPIRICAL_FDP]),
        "seconds": time.perf_counter() - start,
    }


def gaussian_level(seed: int, mu: float, canaries: int) -> dict[str, Any]:
    """Both bounds on ``canaries`` scores of an exactly ``mu``-GDP mechanism."""
    rng = np.random.default_rng(seed)
    coins = rng.random(canaries) < 0.5
    scores = rng.normal(size=canaries) + mu * coins
    fdp = fdp_epsilon(scores, coins, delta=DELTA)
    return {
        "seed": seed,
        "mu": mu,
        "exact": gaussian_mechanism_epsilon(mu, DELTA),
        "steinke": empirical_epsilon(scores, coins, delta=DELTA).epsilon,
        "f-dp": fdp.epsilon,
        "f-dp-mu": fdp.mu,
    }


def _table(rows: list[dict[str, Any]]) -> str:
    frame = pd.DataFrame(rows)
    return frame.to_markdown(index=False, floatfmt=".3g")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--level", choices=("user", "record", "gaussian", "all"), default="all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--central-noise", type=float, nargs="+", default=[0.1, 0.5, 1, 2, 4])
    parser.add_argument("--dp-sgd-noise", type=float, nargs="+", default=[0, 0.5, 1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--canaries", type=int, default=300)
    parser.add_argument("--gaussian-mu", type=float, nargs="+", default=[0.5, 1, 2, 4])
    parser.add_argument("--gaussian-canaries", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--out", type=Path, default=None, help="CSV of every row")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    if args.level in ("user", "all"):
        user = [
            {"level": "user", **user_level(seed, noise, args.rounds, args.canaries)}
            for noise in args.central_noise
            for seed in args.seeds
        ]
        print(f"User level: {args.rounds} rounds, {CLIENTS} clients + {args.canaries} canaries")
        print(_table(user), flush=True)
        rows += user
    if args.level in ("record", "all"):
        record = [
            {"level": "record", **record_level(seed, noise)}
            for noise in args.dp_sgd_noise
            for seed in args.seeds
        ]
        print("Record level: 100 canaries, loss-drop, one round of 60 epochs")
        print(_table(record), flush=True)
        rows += record
    if args.level in ("gaussian", "all"):
        planted = [
            {"level": "gaussian", "canaries": m, **gaussian_level(seed, mu, m)}
            for m in args.gaussian_canaries
            for mu in args.gaussian_mu
            for seed in args.seeds
        ]
        print(f"Gaussian mechanism: scores N(mu, 1) in, N(0, 1) out, delta {DELTA:g}")
        print(_table(planted), flush=True)
        rows += planted
    if args.out:
        pd.DataFrame(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
