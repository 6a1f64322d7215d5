"""Label counting at large batches: today's :func:`infer_labels` against the truth.

Per cell: the median label accuracy (multiset overlap,
:func:`~fedsim.core.metrics.label_accuracy`) over ``--trials`` seeded batches
of real ``mnist-embedded`` test digits (32x32, normalised), read from the probe
gradient (``dL/dtheta``, as :func:`~fedsim.audit.experiment.gradient_probe`
builds it). Two output sizes:

- 10 classes: the digits' own labels.
- 100 classes (CIFAR-100-shaped outputs): the model has ``num_classes=100``
  and digit ``d`` is relabelled ``classes[d]``, ten distinct classes drawn by
  a seeded permutation of 0..99. A batch therefore holds at most 10 of the
  100 classes; the other 90 are absent, which is the hard case for counting
  (their probability mass must be estimated, not read).

Two model states: ``untrained`` (the zoo's ``default`` init, seed 0) and
``trained`` (the same model after ``--steps`` Adam steps, lr 1e-3, batch 64,
on the 4,000 embedded training digits with the same relabelling; the train
accuracy it reaches is printed). Adam, not SGD: these Sigmoid LeNets stayed at
chance (train accuracy 0.10) after 300 SGD steps at lr 0.5, and at lr 0.05
with momentum 0.9, so an SGD-"trained" row would measure an untrained model
twice. One process, CPU::

    .venv/bin/python bench/label_counts.py [--trials 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch
from torch import nn

from fedsim.attacks.labels import infer_labels, last_layer_gradient
from fedsim.audit.experiment import gradient_probe
from fedsim.core.config import DataConfig, ModelConfig
from fedsim.core.data import DatasetBundle, load_dataset
from fedsim.core.metrics import label_accuracy
from fedsim.core.models import InputSpec, build_model

CPU = torch.device("cpu")
BATCHES = (64, 128, 256, 512)
MODELS = ("lenet5-split", "lenet-zhu")
RANK_RTOL = 1e-4
"""Singular values below this share of the largest count as float32 noise."""


def relabelled(data: DatasetBundle, num_classes: int, seed: int = 0) -> DatasetBundle:
    """``data`` with digit ``d`` mapped to a seeded distinct class of ``num_classes``."""
    if num_classes == data.num_classes:
        return data
    classes = torch.randperm(num_classes, generator=torch.Generator().manual_seed(seed))
    classes = classes[: data.num_classes]
    return dataclasses.replace(
        data,
        train_labels=classes[data.train_labels],
        test_labels=classes[data.test_labels],
        num_classes=num_classes,
    )


def trained(net: nn.Module, data: DatasetBundle, steps: int, seed: int = 0) -> float:
    """Train ``net`` in place with Adam; its accuracy on the training digits after."""
    gen = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(steps):
        idx = torch.randint(len(data.train_images), (64,), generator=gen)
        loss = nn.functional.cross_entropy(net(data.train_images[idx]), data.train_labels[idx])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        guess = net(data.train_images).argmax(dim=1)
    return float((guess == data.train_labels).float().mean())


def measure(
    net: nn.Module, cfg: ModelConfig, spec: InputSpec, data: DatasetBundle, batch: int, trials: int
) -> tuple[float, int]:
    """Median label accuracy of :func:`infer_labels` over ``trials`` seeded batches.

    With it, the largest numerical rank of the last layer's weight gradient
    over those batches. ``dL/dW = (P - Y)^T H / B`` and every row of ``P - Y``
    sums to zero, so the rank is at most ``min(B, K - 1, d)``: an instance-wise
    reading (iLRG's) can tell at most that many examples apart.
    """
    gen = torch.Generator().manual_seed(batch)
    accuracy, ranks = [], []
    for _ in range(trials):
        idx = torch.randperm(len(data.test_images), generator=gen)[:batch]
        probe = gradient_probe(
            net, cfg, spec, data.test_images[idx], data.test_labels[idx], data.normalization
        )
        found = infer_labels(probe.observation, CPU)
        accuracy.append(label_accuracy(found, probe.truth.labels))
        weight, _ = last_layer_gradient(probe.observation, CPU)
        ranks.append(int(torch.linalg.matrix_rank(weight.double(), rtol=RANK_RTOL)))
    return statistics.median(accuracy), max(ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    digits = load_dataset(DataConfig(dataset="mnist-embedded", image_size=32, normalize=True))
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    start = time.perf_counter()
    header = (
        "| model | classes | state | " + " | ".join(f"B={b}" for b in BATCHES) + " | rank dL/dW |"
    )
    rows = [header, "|" + "---|" * (4 + len(BATCHES))]
    for name in MODELS:
        for num_classes in (10, 100):
            data = relabelled(digits, num_classes)
            cfg = ModelConfig(name, "default")
            spec = InputSpec(data.channels, data.image_size, num_classes)
            net = build_model(cfg, spec, seed=0)
            for state in ("untrained", "trained"):
                label = state
                if state == "trained":
                    reached = trained(net, data, args.steps)
                    label = f"trained ({args.steps} steps, train acc {reached:.2f})"
                found = [measure(net, cfg, spec, data, b, args.trials) for b in BATCHES]
                cells = [f"{accuracy:.3f}" for accuracy, _ in found]
                rank = "/".join(str(r) for _, r in found)
                rows.append(
                    f"| {name} | {num_classes} | {label} | " + " | ".join(cells) + f" | {rank} |"
                )
                print(rows[-1], flush=True)
    print()
    print("\n".join(rows))
    print(
        f"\n{args.trials} batches per cell, median; {time.perf_counter() - start:.0f} s; "
        f"load average at end: {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
