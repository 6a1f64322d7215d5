"""The attack table: {uniform, Xavier normal} x {DLG, SAPAG} x {MNIST, CIFAR-100} at batch 1.

Each cell is one :class:`fedsim.audit.experiment.AttackExperiment` (what
``fedsim attack`` runs, so its probes, fresh victims and scoring are the ones
measured): LeNet-Zhu, ``--images``
real images picked by ``--seed``, a fresh model per image, the attacks'
paper settings except the step budget and the restarts, which are printed
with the table. Medians over the images: PSNR (peak 1 on [0, 1] pixels),
SSIM, label accuracy; seconds per attack is the wall time of a cell divided
by its images (the images of a cell are attacked as one batched run).

Writes ``attack_tables.csv`` and every cell's experiment folder (table,
grid, settings) under ``--out``; prints the markdown table.

Usage: ``python bench/attack_tables.py [--images 8] [--restarts 2]
[--dlg-steps 60] [--sapag-steps 60] [--out runs/attack-tables]``
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

from fedsim.audit.experiment import (
    AttackExperiment,
    run_attack_experiment,
    write_attack_outputs,
)
from fedsim.core.scenario_file import apply_overrides

DATASETS = {"MNIST": "mnist-embedded", "CIFAR-100": "cifar100-samples"}
INITS = {"uniform": "uniform", "Xavier normal": "xavier-normal"}
ATTACKS = {"DLG": "dlg", "SAPAG": "sapag"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--dlg-steps", type=int, default=60, help="paper: 300")
    parser.add_argument("--sapag-steps", type=int, default=60, help="paper: 500")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="lenet-zhu")
    parser.add_argument("--out", default="runs/attack-tables")
    parser.add_argument(
        "--set",
        dest="params",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra attack parameter for every cell, e.g. labels=infer",
    )
    args = parser.parse_args()
    steps = {"dlg": args.dlg_steps, "sapag": args.sapag_steps}
    out = Path(args.out)
    rows = []
    for data_name, dataset in DATASETS.items():
        for init_name, init in INITS.items():
            for attack_name, attack in ATTACKS.items():
                cell = out / f"{dataset}-{init}-{attack}"
                start = time.perf_counter()
                experiment = AttackExperiment(
                    attack=attack,
                    params={
                        **apply_overrides({}, args.params),
                        "restarts": args.restarts,
                        "steps": steps[attack],
                    },
                    dataset=dataset,
                    init=init,
                    model=args.model,
                    num_images=args.images,
                    seed=args.seed,
                )
                outcome = run_attack_experiment(experiment)
                wall = time.perf_counter() - start
                write_attack_outputs(outcome, cell)
                table = outcome.rows()
                rows.append(
                    {
                        "dataset": data_name,
                        "init": init_name,
                        "attack": attack_name,
                        "psnr": statistics.median(r["psnr"] for r in table),
                        "ssim": statistics.median(r["ssim"] for r in table),
                        "label-acc": statistics.mean(r["label-acc"] for r in table),
                        "seconds": wall / len(table),
                        "images": len(table),
                        "restarts": args.restarts,
                        "steps": steps[attack],
                    }
                )
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "attack_tables.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    extra = f", {' '.join(args.params)}" if args.params else ""
    print(
        f"\n### Batch 1, {args.model}, {args.images} images a cell, seed {args.seed}, "
        f"{args.restarts} restarts, DLG {args.dlg_steps} / SAPAG {args.sapag_steps} "
        f"L-BFGS steps{extra}; medians (label accuracy: mean)\n"
    )
    print("| dataset | init | attack | PSNR dB | SSIM | label acc | s / attack |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['dataset']} | {r['init']} | {r['attack']} | {r['psnr']:.1f} | "
            f"{r['ssim']:.3f} | {r['label-acc']:.0%} | {r['seconds']:.1f} |"
        )
    print(f"\nwrote {out / 'attack_tables.csv'}")


if __name__ == "__main__":
    main()
