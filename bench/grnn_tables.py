"""GRNN against DLG by batch size on real MNIST and CIFAR-100 digits/images.

The GRNN paper's setting: LeNet-5 (GRNN) with U(-0.5, 0.5) weights, images as
3-channel 32x32 in [0, 1], the probe gradient of one batch at a fresh model
(one model seed per victim). For each dataset and batch size {1, 4, 8} both
attacks see the same gradients; GRNN also runs with the ``sorted`` Wasserstein
reading at batch 4. Cells report the median per-image PSNR (peak 1) and SSIM
over every image of every victim, label accuracy over all labels (GRNN's label
branch, DLG's joint soft labels, and beside them the counting method of
:mod:`fedsim.attacks.toolkits.labels` on the same gradients) and the median seconds per
attack, wall and CPU (the machine is shared: the CPU seconds of this
one-thread process are the steadier measure).

Work is sized to about 9 minutes of one CPU core (28 wall minutes on the
shared 2-core box under a load of ~10): GRNN runs the official code's 1000
RMSprop steps, DLG 50 L-BFGS steps of 20 evaluations (the same 1000 gradient
evaluations; the paper's DLG runs 300 steps), one restart each; victims per
cell fall with the batch size so each cell scores 4-8 images.

Usage: ``python bench/grnn_tables.py [--out runs/grnn_tables.csv]``
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import Attack
from fedsim.attacks.reconstruction.grnn import GRNN
from fedsim.attacks.toolkits.labels import infer_labels
from fedsim.audit.experiment import Probe, gradient_probe
from fedsim.core.config import DataConfig, ModelConfig
from fedsim.core.data import load_dataset
from fedsim.core.metrics import label_accuracy, score_reconstruction
from fedsim.core.models import InputSpec, build_model

MODEL = ModelConfig("lenet5-grnn", "uniform")
DATASETS = ("mnist-samples", "cifar100-samples")
VICTIMS = {1: 4, 4: 2, 8: 1}
"""Victim batches per batch size: 4, 8 and 8 images per cell."""


@dataclass(frozen=True)
class Cell:
    """One row of the table."""

    dataset: str
    batch: int
    attack: str
    psnr: float
    ssim: float
    label_accuracy: float
    counting_accuracy: float
    seconds: float
    cpu_seconds: float
    images: int


def probes(dataset: str, batch: int, victims: int) -> list[Probe]:
    """``victims`` disjoint batches (wrapping round the 20 samples), one model seed each."""
    data = load_dataset(DataConfig(dataset=dataset, channels="rgb", image_size=32))
    spec = InputSpec(data.channels, data.image_size, data.num_classes)
    out = []
    for v in range(victims):
        index = torch.arange(v * batch, (v + 1) * batch) % len(data.train_labels)
        net = build_model(MODEL, spec, seed=v)
        images, labels = data.train_images[index], data.train_labels[index]
        out.append(gradient_probe(net, MODEL, spec, images, labels, data.normalization))
    return out


def run_cell(dataset: str, batch: int, name: str, attack: Attack) -> Cell:
    """Attack every victim of one cell and summarise."""
    psnr: list[float] = []
    ssim: list[float] = []
    seconds: list[float] = []
    cpu_seconds: list[float] = []
    correct = counted = 0.0
    for seed, probe in enumerate(probes(dataset, batch, VICTIMS[batch])):
        truth = probe.truth
        cpu = time.process_time()
        rec = attack.reconstruct(probe.observation, seed=seed)
        cpu_seconds.append(time.process_time() - cpu)
        score = score_reconstruction(rec.images, truth.images, rec.labels, truth.labels)
        psnr += score.per_image_psnr
        ssim += score.per_image_ssim
        seconds.append(rec.seconds)
        correct += score.label_accuracy * batch
        counted += (
            label_accuracy(infer_labels(probe.observation, attack.device), truth.labels) * batch
        )
    images = len(psnr)
    return Cell(
        dataset,
        batch,
        name,
        statistics.median(psnr),
        statistics.median(ssim),
        correct / images,
        counted / images,
        statistics.median(seconds),
        statistics.median(cpu_seconds),
        images,
    )


def attacks(grnn_steps: int, dlg_steps: int) -> dict[str, Attack]:
    """The compared attacks by row name, one restart each."""
    dlg = ATTACKS.get("dlg")
    return {
        "DLG": dlg(dlg.Params(steps=dlg_steps, restarts=1)),
        "GRNN (l2)": GRNN(GRNN.Params(steps=grnn_steps, wasserstein="l2")),
        "GRNN (sorted)": GRNN(GRNN.Params(steps=grnn_steps, wasserstein="sorted")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grnn-steps", type=int, default=1000)
    parser.add_argument("--dlg-steps", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("runs/grnn_tables.csv"))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"LeNet-5 (GRNN), U(-0.5, 0.5), 3x32x32; GRNN {args.grnn_steps} RMSprop steps, "
        f"DLG {args.dlg_steps} L-BFGS steps x 20 evaluations; 1 restart; {args.threads} thread(s)"
    )
    print("PSNR peak 1 on [0, 1]; medians over images; counting = iDLG (batch 1) / counting method")
    print()
    columns = ["data", "batch", "attack", "PSNR dB", "SSIM", "label acc", "counting acc",
               "s/attack", "CPU s/attack", "images"]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    runners = attacks(args.grnn_steps, args.dlg_steps)
    cells = []
    start = time.perf_counter()
    for dataset in DATASETS:
        for batch in VICTIMS:
            names = ["DLG", "GRNN (l2)"] + (["GRNN (sorted)"] if batch == 4 else [])
            for name in names:
                cell = run_cell(dataset, batch, name, runners[name])
                cells.append(cell)
                print(
                    f"| {dataset} | {batch} | {name} | {cell.psnr:.1f} | {cell.ssim:.3f} "
                    f"| {cell.label_accuracy:.2f} | {cell.counting_accuracy:.2f} "
                    f"| {cell.seconds:.1f} | {cell.cpu_seconds:.1f} | {cell.images} |",
                    flush=True,
                )
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[field.name for field in fields(Cell)])
        writer.writeheader()
        writer.writerows(asdict(c) for c in cells)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
