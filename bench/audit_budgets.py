"""Where each attack stops improving: the measurement behind ``audit.attacks = "auto"``'s budgets.

For each model family (LeNet-5 as FedCG's ``lenet5-split`` on embedded MNIST
with PyTorch's default init; LeNet-Zhu on CIFAR-100 samples with U(-0.5, 0.5)),
each batch size and each optimisation attack of the portfolio, the attack runs
at a ladder of step budgets on the same ``--images`` unseen images (a fresh
victim model per image, the probe threat model, the portfolio's restarts),
with early stopping on, as the audit runs it. Per rung: median PSNR, SSIM and
label accuracy, the median steps actually taken, the converged share and the
seconds per image (one thread). The *knee* is the smallest budget whose
median PSNR is within ``--tolerance`` dB of the best rung's: more steps buy
nothing measurable there.

Usage: ``python bench/audit_budgets.py [--images 4] [--batch 1 4]
[--out runs/audit-budgets]``; prints a markdown table and writes
``audit_budgets.csv``. State the machine's load beside any number taken from it.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path

from fedsim.audit.experiment import AttackExperiment, run_attack_experiment

FAMILIES = {
    "lenet5-split": ("mnist-embedded", "default"),
    "lenet-zhu": ("cifar100-samples", "uniform"),
}
LADDERS = {
    "inverting-gradients": (250, 500, 1000, 2000),
    "dlg": (10, 25, 50, 100),
    "sapag": (10, 25, 50, 100),
    "grnn": (250, 500, 1000),
}
RESTARTS = {"inverting-gradients": 2, "dlg": 2, "sapag": 2, "grnn": 1}
SEED = 101  # images the tests do not draw (they use seeds 0-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--models", nargs="+", default=list(FAMILIES))
    parser.add_argument("--attacks", nargs="+", default=list(LADDERS))
    parser.add_argument("--tolerance", type=float, default=0.5, help="dB")
    parser.add_argument("--out", default="runs/audit-budgets")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    rows = []
    for model in args.models:
        dataset, init = FAMILIES[model]
        for batch in args.batch:
            for attack in args.attacks:
                rungs = []
                for steps in LADDERS[attack]:
                    experiment = AttackExperiment(
                        attack=attack,
                        params={"steps": steps, "restarts": RESTARTS[attack]},
                        dataset=dataset,
                        model=model,
                        init=init,
                        batch_size=batch,
                        num_images=args.images * batch,
                        seed=SEED,
                    )
                    started = time.perf_counter()
                    outcome = run_attack_experiment(experiment)
                    seconds = (time.perf_counter() - started) / args.images
                    recs, scores = outcome.reconstructions, outcome.scores
                    rung = {
                        "model": model,
                        "batch": batch,
                        "attack": attack,
                        "budget": steps,
                        "psnr": statistics.median(s.psnr for s in scores),
                        "ssim": statistics.median(s.ssim for s in scores),
                        "label-acc": statistics.median(s.label_accuracy for s in scores),
                        "steps-taken": statistics.median(r.steps_taken for r in recs),
                        "converged": sum(r.converged for r in recs) / len(recs),
                        "seconds": seconds,
                    }
                    rungs.append(rung)
                    print(rung, flush=True)
                best = max(r["psnr"] for r in rungs)
                knee = min(r["budget"] for r in rungs if r["psnr"] >= best - args.tolerance)
                for r in rungs:
                    r["knee"] = knee
                rows += rungs
    with open(out / "audit_budgets.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print()
    print(
        "| model | batch | attack | budget | PSNR | SSIM | labels | steps taken | converged "
        "| s/image | knee |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['batch']} | {r['attack']} | {r['budget']} | {r['psnr']:.2f} "
            f"| {r['ssim']:.3f} | {r['label-acc']:.2f} | {r['steps-taken']:.0f} "
            f"| {r['converged']:.0%} | {r['seconds']:.1f} | {r['knee']} |"
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
