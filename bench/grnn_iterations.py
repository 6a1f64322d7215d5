"""GRNN iterations per second: the project's attack against a minimal loop.

Both sides do the same work per iteration (generator forward, the victim's
gradient with ``create_graph``, the loss, backward, one RMSprop step) on the
same LeNet-5 (GRNN) probe gradient of real MNIST digits. The minimal loop is
what the official code does, written inline on a plain ``nn.Module``; the
project's side is :meth:`fedsim.attacks.reconstruction.grnn.GRNN.reconstruct` end to end (setup and
the final scoring pass included). Runs alternate and each ratio (speed of
the second over the first, > 1 is faster) is the median of the per-repeat
ratios, as the machine is shared.

Usage: ``python bench/grnn_iterations.py [--iterations 200] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
import torch.nn.functional as F

from fedsim.attacks.base import Observation
from fedsim.attacks.reconstruction.grnn import GRNN, GrnnGenerator, total_variation
from fedsim.audit.experiment import gradient_probe
from fedsim.core.config import DataConfig, ModelConfig
from fedsim.core.data import load_dataset
from fedsim.core.models import InputSpec, SplitNet, build_model

MODEL = ModelConfig("lenet5-grnn", "uniform")


def probe(batch: int, seed: int = 0) -> tuple[SplitNet, Observation]:
    """The victim and a probe observation of ``batch`` real MNIST digits."""
    data = load_dataset(DataConfig(dataset="mnist-samples", channels="rgb", image_size=32))
    spec = InputSpec(data.channels, data.image_size, data.num_classes)
    model = build_model(MODEL, spec, seed=seed)
    images, labels = data.train_images[:batch], data.train_labels[:batch]
    return model, gradient_probe(model, MODEL, spec, images, labels, data.normalization).observation


def minimal_loop(
    model: SplitNet, observation: Observation, iterations: int, device: torch.device
) -> float:
    """The official code's loop, inline; returns seconds."""
    start = time.perf_counter()
    model = model.to(device)
    spec = observation.input_spec
    target = torch.cat([g.flatten() for g in observation.shared.values()]).to(device)
    generator = GrnnGenerator(spec.channels, spec.image_size, spec.num_classes).to(device)
    z = torch.randn(observation.num_examples, 128, device=device)
    optimizer = torch.optim.RMSprop(generator.parameters(), lr=1e-4, momentum=0.99)
    for _ in range(iterations):
        images, labels = generator(z)
        loss = -(labels * F.log_softmax(model(images), dim=-1)).sum(dim=-1).mean()
        grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        diff = torch.cat([g.flatten() for g in grads]) - target
        total = diff.pow(2).sum() + diff.norm() + 1e-3 * total_variation(images)
        optimizer.zero_grad()
        total.backward(inputs=list(generator.parameters()))
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def project(observation: Observation, iterations: int, device: torch.device, reading: str) -> float:
    """:class:`GRNN` end to end; returns seconds."""
    params = GRNN.Params(steps=iterations, wasserstein=reading)  # type: ignore[arg-type]
    start = time.perf_counter()
    GRNN(params, device=device).reconstruct(observation, seed=0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(
        f"device {device}, {args.threads} thread(s), {args.iterations} iterations, "
        f"median of {args.repeats} alternating repeats"
    )
    print(
        "| batch | minimal it/s | GRNN l2 it/s | GRNN sorted it/s | l2 vs minimal | sorted vs l2 |"
    )
    print("|---|---|---|---|---|---|")
    for batch in args.batches:
        model, observation = probe(batch)
        times: dict[str, list[float]] = {"minimal": [], "l2": [], "sorted": []}
        # Warm-up: first-call allocations and kernel selection are not iterations.
        minimal_loop(model, observation, 5, device)
        project(observation, 5, device, "l2")
        for _ in range(args.repeats):
            times["minimal"].append(minimal_loop(model, observation, args.iterations, device))
            times["l2"].append(project(observation, args.iterations, device, "l2"))
            times["sorted"].append(project(observation, args.iterations, device, "sorted"))
        rate = {k: args.iterations / statistics.median(v) for k, v in times.items()}
        ratio = statistics.median(m / p for m, p in zip(times["minimal"], times["l2"], strict=True))
        sort_cost = statistics.median(
            a / b for a, b in zip(times["l2"], times["sorted"], strict=True)
        )
        print(
            f"| {batch} | {rate['minimal']:.1f} | {rate['l2']:.1f} | {rate['sorted']:.1f} "
            f"| {ratio:.2f}x | {sort_cost:.2f}x |"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
