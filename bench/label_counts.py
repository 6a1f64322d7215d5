"""Labels at large batches: counting and iLRG side by side against the truth.

Per cell: the median label accuracy (multiset overlap,
:func:`~fedsim.core.metrics.label_accuracy`) over ``--trials`` seeded batches
of real ``mnist-embedded`` test digits (32x32, normalised), read from the probe
gradient (``dL/dtheta``, as :func:`~fedsim.audit.experiment.gradient_probe`
builds it) by both batch readings of :func:`~fedsim.attacks.toolkits.labels.infer_labels`:
``count`` (bias-corrected counting, mean softmax from noise images) and
``ilrg`` (Ma et al. 2023, a softmax per class read off the gradient). Beside
them, the smallest singular value of iLRG's system over its largest (the
worst over the cell's batches): the attacker can compute it, and near zero
it says the counts rest on the sum equation alone. Two output sizes:

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
twice. One process, one CPU thread; the seconds are the median per read::

    .venv/bin/python bench/label_counts.py [--trials 5] [--steps 500]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch
from torch import nn

from fedsim.attacks.toolkits.labels import ilrg_system, infer_labels
from fedsim.audit.experiment import gradient_probe
from fedsim.core.config import DataConfig, ModelConfig
from fedsim.core.data import DatasetBundle, load_dataset
from fedsim.core.metrics import label_accuracy
from fedsim.core.models import InputSpec, build_model
from fedsim.core.params.labels import BatchLabels

CPU = torch.device("cpu")
BATCHES = (64, 128, 256, 512)
MODELS = ("lenet5-split", "lenet-zhu")
METHODS: tuple[BatchLabels, ...] = ("count", "ilrg")


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


@dataclasses.dataclass
class Cell:
    """One batch size's readings: per method the accuracies and seconds, and iLRG's conditioning."""

    accuracy: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    seconds: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    conditioning: list[float] = dataclasses.field(default_factory=list)

    def median(self, method: str) -> float:
        return statistics.median(self.accuracy[method])


def measure(
    net: nn.Module, cfg: ModelConfig, spec: InputSpec, data: DatasetBundle, batch: int, trials: int
) -> Cell:
    """Both methods on ``trials`` seeded batches of ``batch`` test digits."""
    gen = torch.Generator().manual_seed(batch)
    cell = Cell({m: [] for m in METHODS}, {m: [] for m in METHODS})
    for _ in range(trials):
        idx = torch.randperm(len(data.test_images), generator=gen)[:batch]
        probe = gradient_probe(
            net, cfg, spec, data.test_images[idx], data.test_labels[idx], data.normalization
        )
        for method in METHODS:
            start = time.perf_counter()
            found = infer_labels(probe.observation, CPU, method)
            cell.seconds[method].append(time.perf_counter() - start)
            cell.accuracy[method].append(label_accuracy(found, probe.truth.labels))
        singular = torch.linalg.svdvals(ilrg_system(probe.observation, CPU)[0])
        cell.conditioning.append(float(singular[-1] / singular[0]))
    return cell


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
        "| model | classes | state | "
        + " | ".join(f"B={b} count / iLRG" for b in BATCHES)
        + " | iLRG sigma_min / sigma_max |"
    )
    rows = [header, "|" + "---|" * (4 + len(BATCHES))]
    seconds: dict[str, dict[int, list[float]]] = {m: {b: [] for b in BATCHES} for m in METHODS}
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
                cells = {b: measure(net, cfg, spec, data, b, args.trials) for b in BATCHES}
                for b, cell in cells.items():
                    for method in METHODS:
                        seconds[method][b] += cell.seconds[method]
                shown = [
                    f"{c.median('count'):.3f} / {c.median('ilrg'):.3f}" for c in cells.values()
                ]
                worst = min(min(c.conditioning) for c in cells.values())
                rows.append(
                    f"| {name} | {num_classes} | {label} | "
                    + " | ".join(shown)
                    + f" | {worst:.1e} |"
                )
                print(rows[-1], flush=True)
    print()
    print("\n".join(rows))
    print("\nmedian seconds per read (all cells):")
    for method in METHODS:
        print(
            f"  {method}: "
            + ", ".join(f"B={b} {statistics.median(seconds[method][b]):.4f}" for b in BATCHES)
        )
    print(
        f"\n{args.trials} batches per cell, median; {time.perf_counter() - start:.0f} s; "
        f"load average at end: {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
