"""The batch-size frontier: where each attack stops recovering images as batches grow.

Each cell is one :class:`fedsim.audit.experiment.AttackExperiment` (what
``fedsim attack`` runs: real images picked by ``--seed``, a fresh victim per
batch, the gradient probe the server would see, scoring against the truth):
an attack x a model x a data set x a batch size, ``--victims`` batches per
cell (fewer where the data set has too few images; CIFAR-100 samples hold
20, so their largest batch is 16). Medians over a cell's batches: PSNR (peak 1
on [0, 1] pixels), SSIM, the attack's label accuracy, and the label accuracy of
counting alone (:func:`fedsim.attacks.toolkits.labels.infer_labels` on the probe:
iDLG at batch 1, the bias-corrected count otherwise), which is what a batch
larger than the number of classes, necessarily with repeated labels, tests.
LFW faces have no identity labels: every face is class 0 (all labels repeat).

Writes ``frontier.csv``, ``frontier.md`` and ``frontier.png`` (median PSNR,
SSIM and label accuracy per batch size, one line per attack, model and data
set) under ``--out``; prints the markdown table.

Usage: ``python bench/frontier.py [--attacks dlg ig] [--models lenet-zhu resnet18]
[--datasets mnist-embedded cifar100-samples lfw-faces] [--batch-sizes 1 2 4 8 16 32 64]
[--steps dlg=20 ig=200] [--restarts 1] [--victims 2] [--device auto] [--out runs/frontier]``
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from fedsim.attacks.toolkits.labels import infer_labels
from fedsim.audit.experiment import AttackExperiment, run_attack_experiment
from fedsim.core.config import DataConfig
from fedsim.core.data import load_dataset
from fedsim.core.metrics import label_accuracy

COLUMNS = (
    "attack",
    "model",
    "dataset",
    "batch",
    "victims",
    "psnr",
    "ssim",
    "label-acc",
    "count-label-acc",
    "seconds",
)
INIT = {"lenet-zhu": "uniform"}  # DLG's setting; other models keep PyTorch's default


def cell(
    attack: str,
    model: str,
    dataset: str,
    batch: int,
    victims: int,
    params: dict[str, Any],
    device: str,
    seed: int,
) -> dict[str, Any]:
    """Attack ``victims`` batches of ``batch`` images; medians over them."""
    experiment = AttackExperiment(
        attack=attack,
        params=params,
        dataset=dataset,
        model=model,
        init=INIT.get(model, "default"),
        batch_size=batch,
        num_images=batch * victims,
        seed=seed,
        device=device,
        parallel=victims,
    )
    start = time.perf_counter()
    outcome = run_attack_experiment(experiment)
    seconds = (time.perf_counter() - start) / victims
    counted = [
        label_accuracy(infer_labels(p.observation, torch.device("cpu")), p.truth.labels)
        for p in outcome.probes
    ]
    medians = outcome.medians()
    return {
        "attack": attack,
        "model": model,
        "dataset": dataset,
        "batch": batch,
        "victims": victims,
        "psnr": round(medians["psnr"], 2),
        "ssim": round(medians["ssim"], 3),
        "label-acc": round(medians["label-acc"], 3),
        "count-label-acc": round(statistics.median(counted), 3),
        "seconds": round(seconds, 1),
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Median PSNR, SSIM and label accuracy against batch size (log 2 axis)."""
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    series: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        series.setdefault((row["attack"], row["model"], row["dataset"]), []).append(row)
    for (attack, model, dataset), points in sorted(series.items()):
        batches = [p["batch"] for p in points]
        for axis, metric in zip(axes, ("psnr", "ssim", "label-acc"), strict=True):
            axis.plot(
                batches,
                [p[metric] for p in points],
                marker="o",
                label=f"{attack} {model} {dataset}",
            )
    for axis, title in zip(
        axes, ("median PSNR (dB)", "median SSIM", "median label accuracy"), strict=True
    ):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("batch size")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table in markdown."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attacks", nargs="+", default=["dlg", "ig"])
    parser.add_argument("--models", nargs="+", default=["lenet-zhu", "resnet18"])
    parser.add_argument(
        "--datasets", nargs="+", default=["mnist-embedded", "cifar100-samples", "lfw-faces"]
    )
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument(
        "--steps",
        nargs="*",
        default=["dlg=20", "ig=200"],
        help="attack=steps budgets (paper: dlg 300 L-BFGS steps, ig 4800-24000 Adam steps)",
    )
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--victims", type=int, default=2, help="batches per cell (at most)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="runs/frontier")
    args = parser.parse_args()
    steps = {a: int(s) for a, s in (item.split("=", 1) for item in args.steps)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for dataset in args.datasets:
        available = len(load_dataset(DataConfig(dataset=dataset)).test_images)
        for model in args.models:
            for attack in args.attacks:
                params: dict[str, Any] = {"restarts": args.restarts}
                if attack in steps:
                    params["steps"] = steps[attack]
                for batch in args.batch_sizes:
                    victims = min(args.victims, available // batch)
                    if victims == 0:
                        continue  # the data set has fewer images than the batch
                    rows.append(
                        cell(attack, model, dataset, batch, victims, params, args.device, args.seed)
                    )
                    print(markdown(rows[-1:]).splitlines()[-1], flush=True)
                    with (out / "frontier.csv").open("w", newline="") as f:
                        writer = csv.DictWriter(f, fieldnames=COLUMNS)
                        writer.writeheader()
                        writer.writerows(rows)
    (out / "frontier.md").write_text(markdown(rows) + "\n")
    plot(rows, out / "frontier.png")
    print(markdown(rows))
    print(f"budgets: {steps} steps, {args.restarts} restart(s), seed {args.seed}")


if __name__ == "__main__":
    main()
