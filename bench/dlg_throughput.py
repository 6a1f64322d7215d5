"""DLG objective evaluations per second: the project's attack against a minimal loop.

Part 1, the same work: DLG on LeNet-Zhu (U(-0.5, 0.5)), one real CIFAR-100
image at batch 1, N(0, 1) dummy image and label logits, squared-L2 gradient
distance, L-BFGS lr 1 with PyTorch's defaults (20 evaluations a step, history
100). The minimal loop is the DLG paper's code written inline: a plain
``nn.Module``, ``torch.autograd.grad(create_graph=True)`` and
``torch.optim.LBFGS``. The project's side is ``DLG.reconstruct`` end to end
(setup, the final evaluation and the restart bookkeeping included) with one
restart. Runs alternate; each side's rate is the median over repeats, as the
machine is shared.

Part 2, beyond: several restarts, or several victims' attacks, in one
process. The project batches them as rows of one ``torch.func.vmap``
evaluation and one row-wise L-BFGS; the gain is measured against part 1's
single-restart rate.

Usage: ``python bench/dlg_throughput.py [--steps 25] [--repeats 5] [--threads 1]``
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
import torch.nn.functional as F

from fedsim.attacks.base import Observation
from fedsim.attacks.registry import create_attack
from fedsim.audit.experiment import gradient_probe
from fedsim.core.config import DataConfig, ModelConfig
from fedsim.core.data import load_dataset
from fedsim.core.models import InputSpec, SplitNet, build_model

MODEL = ModelConfig("lenet-zhu", "uniform")


def victims(count: int, same_model: bool = False) -> list[tuple[SplitNet, Observation]]:
    """``count`` victims: a LeNet-Zhu (fresh, or one for all) and one CIFAR-100 image each."""
    data = load_dataset(DataConfig(dataset="cifar100-samples", image_size=32))
    spec = InputSpec(data.channels, data.image_size, data.num_classes)
    out = []
    for i in range(count):
        model = build_model(MODEL, spec, seed=0 if same_model else i)
        probe = gradient_probe(
            model,
            MODEL,
            spec,
            data.test_images[i : i + 1],
            data.test_labels[i : i + 1],
            data.normalization,
        )
        out.append((model, probe.observation))
    return out


def minimal_dlg(model: SplitNet, observation: Observation, steps: int) -> tuple[int, float]:
    """The DLG paper's loop; returns (objective evaluations, seconds)."""
    start = time.perf_counter()
    params = list(model.parameters())
    target = [observation.shared[n] for n, _ in model.named_parameters()]
    spec = observation.input_spec
    torch.manual_seed(0)
    dummy = torch.randn(1, spec.channels, spec.image_size, spec.image_size, requires_grad=True)
    label = torch.randn(1, spec.num_classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([dummy, label], lr=1)
    evaluations = 0

    def closure() -> torch.Tensor:
        nonlocal evaluations
        evaluations += 1
        optimizer.zero_grad()
        loss = -(F.softmax(label, -1) * F.log_softmax(model(dummy), -1)).sum(-1).mean()
        grads = torch.autograd.grad(loss, params, create_graph=True)
        distance = sum(((g - t) ** 2).sum() for g, t in zip(grads, target, strict=True))
        distance.backward()  # type: ignore[union-attr]
        return distance  # type: ignore[return-value]

    for _ in range(steps):
        optimizer.step(closure)
    return evaluations, time.perf_counter() - start


def project_dlg(observations: list[Observation], steps: int, restarts: int) -> tuple[int, float]:
    """The project's DLG on all observations at once; returns (evaluations, seconds)."""
    attack = create_attack("dlg", {"steps": steps, "restarts": restarts})
    start = time.perf_counter()
    recs = attack.reconstruct_many(observations, seed=0)
    seconds = time.perf_counter() - start
    return sum(sum(r.details["evaluations"]) for r in recs), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="L-BFGS steps a run (20 evals each)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pool = {False: victims(8), True: victims(8, same_model=True)}
    model, observation = pool[False][0]
    project_dlg([observation], 1, 1)  # warm-up: imports and first-call costs
    minimal_dlg(model, observation, 1)

    print(
        f"# DLG throughput: LeNet-Zhu, CIFAR-100 batch 1, {args.steps} L-BFGS steps a run, "
        f"{args.repeats} repeats, {torch.get_num_threads()} thread(s), medians\n"
    )
    minimal, project = [], []
    for _ in range(args.repeats):
        evals, seconds = minimal_dlg(model, observation, args.steps)
        minimal.append(evals / seconds)
        evals, seconds = project_dlg([observation], args.steps, 1)
        project.append(evals / seconds)
    single = statistics.median(project)
    print("| run | evaluations/s | vs minimal loop |")
    print("|---|---:|---:|")
    print(f"| minimal PyTorch DLG loop | {statistics.median(minimal):.0f} | 1.00x |")
    print(f"| project DLG, 1 restart | {single:.0f} | {single / statistics.median(minimal):.2f}x |")

    print("\n| batched in one process | problems | evaluations/s | vs project, 1 restart |")
    print("|---|---:|---:|---:|")
    for label, count, restarts, same in (
        ("8 restarts, 1 victim", 1, 8, False),
        ("1 restart, 8 victims, 8 models", 8, 1, False),
        ("1 restart, 8 victims, one model (a round's clients)", 8, 1, True),
        ("4 restarts, 8 victims, 8 models", 8, 4, False),
    ):
        observations = [obs for _, obs in pool[same][:count]]
        rates = []
        for _ in range(max(1, args.repeats // 2)):
            evals, seconds = project_dlg(observations, args.steps, restarts)
            rates.append(evals / seconds)
        rate = statistics.median(rates)
        print(f"| {label} | {count * restarts} | {rate:.0f} | {rate / single:.2f}x |")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
