"""How far one victim's verdict moves under another float path, and whether the interval covers it.

The same victims (``--images`` unseen embedded MNIST digits, FedCG's LeNet-5 at
PyTorch's default init, the probe at batch 1) are attacked by the portfolio's
optimisation attacks at their budgets (``fedsim.scenario.portfolio``), once
in float32 and once in float64 (``audit.precision``). Per victim the verdict is
the best PSNR over the attacks. Printed: each victim's two verdicts and their
difference; the median absolute difference; and, reading the victims as one
round's, the float32 median's 95 % bootstrap interval (the audit's own
:func:`~fedsim.core.metrics.median_interval`) and whether it holds the float64
median.

Usage: ``python bench/float_paths.py [--images 8]``. State the load beside the
seconds (the PSNRs do not depend on it).
"""

from __future__ import annotations

import argparse
import os
import statistics

from fedsim.attacks.base import AttackSetting
from fedsim.audit.experiment import AttackExperiment, run_attack_experiment
from fedsim.core.metrics import median_interval
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.scenario.portfolio import budget

ATTACKS = ("inverting-gradients", "dlg", "sapag")
SEED = 202  # images the tests do not draw


def verdicts(images: int, precision: str) -> list[float]:
    """Per victim, the best PSNR over :data:`ATTACKS` at ``precision``."""
    scenario = scenario_from_dict(
        {"model": {"name": "lenet5-split"}, "audit": {"threat-model": "probe"}}
    )
    best = [float("-inf")] * images
    for attack in ATTACKS:
        params = budget(attack, AttackSetting.of(scenario, None))
        params.pop("unroll", None)
        experiment = AttackExperiment(
            attack=attack,
            params=params,
            dataset="mnist-embedded",
            model="lenet5-split",
            init="default",
            num_images=images,
            seed=SEED,
            precision=precision,  # type: ignore[arg-type]
        )
        scores = run_attack_experiment(experiment).scores
        print(f"{precision} {attack}: " + " ".join(f"{s.psnr:.2f}" for s in scores), flush=True)
        best = [max(b, s.psnr) for b, s in zip(best, scores, strict=True)]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    single = verdicts(args.images, "float32")
    double = verdicts(args.images, "float64")
    print("\n| victim | float32 verdict | float64 verdict | difference |")
    print("|---|---|---|---|")
    for i, (a, b) in enumerate(zip(single, double, strict=True)):
        print(f"| {i} | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    moved = statistics.median(abs(b - a) for a, b in zip(single, double, strict=True))
    interval = median_interval(single, seed=SEED)
    other = statistics.median(double)
    covered = interval.low <= other <= interval.high
    print(
        f"\nmedian |difference| per victim: {moved:.2f} dB (max "
        f"{max(abs(b - a) for a, b in zip(single, double, strict=True)):.2f})"
    )
    print(
        f"float32 median {interval.value:.2f} dB, 95 % interval [{interval.low:.2f}, "
        f"{interval.high:.2f}]; float64 median {other:.2f} dB: "
        f"{'inside' if covered else 'OUTSIDE'} the interval"
    )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
