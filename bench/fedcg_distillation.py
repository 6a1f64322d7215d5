"""Seconds per round of FedCG's server distillation on CPU, FMNIST(4) shapes.

Times :func:`fedsim.strategies.distillation.distill` with four client teachers
(``lenet5-split`` at 32x32, 10 classes, the 16x5x5 feature generator) at the
paper's 2,000 iterations and at the default of ``scenarios/fmnist4-fedcg.toml``,
and prints the median of ``--repeats`` runs of each, their ratio and the peak
memory. Timing does not depend on the weights, so teachers are freshly built.

Run: ``.venv/bin/python bench/fedcg_distillation.py [--repeats 3] [--threads N]``

``--compare`` instead measures the two ways issue 17 weighed of keeping
distillation from making the global pair worse, over ``--rounds`` rounds of
synthetic clients (each round's teachers: the global pair plus independent
Gaussian drift of ``--drift`` times each tensor's std, as local training
would move it, from a pair first trained so that ``C(G(z, y))`` predicts ``y``;
the student starts at their weighted average): a fresh Adam
each round behind the KL gate (what FedCG ships), a fresh Adam without the
gate, and one Adam whose state carries over the rounds without the gate.
It prints, per round and way, the KL on 256 held-out codes before and after.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
import tomllib
from pathlib import Path

import torch

from fedsim.core.config import ComponentConfig, ModelConfig
from fedsim.core.gan import GanSplitNet, build_gan_split_net
from fedsim.core.models import InputSpec
from fedsim.core.scenario_file import component_params
from fedsim.strategies.distillation import (
    Teacher,
    distill,
    distill_if_better,
    sample_codes,
    teacher_student_kl,
)
from fedsim.strategies.fedcg import FedCG, FedCGParams

PAPER_ITERATIONS = 2000
SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "fmnist4-fedcg.toml"


def scenario_params() -> FedCGParams:
    """The FedCG parameters the FMNIST(4) scenario sets (no data needed)."""
    table = dict(tomllib.loads(SCENARIO.read_text())["strategy"])
    name = table.pop("name")
    params: FedCGParams = component_params(FedCG, ComponentConfig(name, table), "strategy")
    return params


def new_pair(seed: int) -> GanSplitNet:
    """A fresh LeNet-5 generator/classifier pair at the FMNIST(4) input shape."""
    return build_gan_split_net(ModelConfig("lenet5-split"), InputSpec(1, 32, 10), seed=seed)


def seconds(iterations: int, batch_size: int, lr: float, clients: int) -> float:
    """Wall seconds of one distillation round from ``clients`` teachers."""
    teachers = [Teacher(1.0 / clients, new_pair(seed=1 + i)) for i in range(clients)]
    student = new_pair(seed=0)
    started = time.perf_counter()
    distill(student, teachers, iterations, batch_size, lr, seed=0)
    return time.perf_counter() - started


def drifted(net: GanSplitNet, drift: float, generator: torch.Generator) -> GanSplitNet:
    """A copy of ``net`` with every float tensor moved by ``drift`` x its std (a client's round)."""
    copy = new_pair(seed=0)
    state = net.state_dict()
    for key, value in state.items():
        if value.is_floating_point() and value.numel() > 1 and "running" not in key:
            noise = torch.randn(value.shape, generator=generator)
            state[key] = value + drift * float(value.std()) * noise
    copy.load_state_dict(state)
    return copy


def trained_pair(steps: int = 300) -> GanSplitNet:
    """A generator/classifier pair trained so that C(G(z, y)) predicts y: confident
    outputs, as a global pair has after some rounds (an untrained one is uniform)."""
    net = new_pair(seed=0)
    net.eval()
    adam = torch.optim.Adam([*net.generator.parameters(), *net.classifier.parameters()], lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        z, y = sample_codes(64, net, gen)
        loss = torch.nn.functional.cross_entropy(net.classifier(net.generator(z, y)), y)
        adam.zero_grad(set_to_none=True)
        loss.backward()
        adam.step()
    return net


def compare_ways(params: FedCGParams, clients: int, rounds: int, drift: float) -> None:
    """Per round: held-out KL before/after for the gate, no gate, and a kept Adam."""
    ways = ("fresh Adam + gate", "fresh Adam, no gate", "kept Adam, no gate")
    start = trained_pair()
    globals_ = {way: new_pair(seed=0) for way in ways}
    for student in globals_.values():
        student.load_state_dict(start.state_dict())
    kept = globals_["kept Adam, no gate"]
    kept_adam = torch.optim.Adam(
        [*kept.generator.parameters(), *kept.classifier.parameters()], lr=params.distill_lr
    )
    worse = dict.fromkeys(ways, 0)
    print(
        f"{rounds} rounds, {clients} teachers, drift {drift} x std, "
        f"{params.distill_iterations} iterations, lr {params.distill_lr}"
    )
    for r in range(1, rounds + 1):
        cells = []
        for way, student in globals_.items():
            gen = torch.Generator().manual_seed(r)  # the same clients and codes for every way
            teachers = [
                Teacher(1.0 / clients, drifted(student, drift, gen)) for _ in range(clients)
            ]
            average = {
                k: sum(t.weight * t.net.state_dict()[k] for t in teachers)
                for k in student.state_dict()
            }
            student.load_state_dict(average)  # same Parameter objects: a kept Adam stays bound
            held_out = sample_codes(256, student, torch.Generator().manual_seed(10_000 + r))
            before = teacher_student_kl(student, teachers, *held_out)
            if way == "fresh Adam + gate":
                after = distill_if_better(
                    student,
                    teachers,
                    held_out,
                    params.distill_iterations,
                    params.distill_batch_size,
                    params.distill_lr,
                    seed=r,
                ).kl_after
            else:
                distill(
                    student,
                    teachers,
                    params.distill_iterations,
                    params.distill_batch_size,
                    params.distill_lr,
                    seed=r,
                    optimizer=kept_adam if way == "kept Adam, no gate" else None,
                )
                after = teacher_student_kl(student, teachers, *held_out)
            worse[way] += after > before
            cells.append(f"{before:.2e} -> {after:.2e}")
        print(f"round {r}: " + " | ".join(f"{w}: {c}" for w, c in zip(ways, cells, strict=True)))
    print(
        "rounds where distillation raised the KL: "
        + ", ".join(f"{w} {n}/{rounds}" for w, n in worse.items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    parser.add_argument("--compare", action="store_true", help="gate vs kept Adam (see above)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--drift", type=float, default=0.05)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = scenario_params()
    if args.compare:
        compare_ways(params, args.clients, args.rounds, args.drift)
        return
    print(
        f"torch threads {torch.get_num_threads()}, {args.clients} teachers, "
        f"batch {params.distill_batch_size}, median of {args.repeats}"
    )
    medians = {}
    for label, iterations in (
        ("paper", PAPER_ITERATIONS),
        ("scenario default", params.distill_iterations),
    ):
        runs = [
            seconds(iterations, params.distill_batch_size, params.distill_lr, args.clients)
            for _ in range(args.repeats)
        ]
        medians[label] = statistics.median(runs)
        print(
            f"{label:>16}: {iterations:5d} iterations  {medians[label]:7.2f} s/round  "
            f"({1000 * medians[label] / max(1, iterations):.1f} ms/iteration; "
            f"runs {', '.join(f'{r:.2f}' for r in runs)})"
        )
    ratio = medians["paper"] / max(medians["scenario default"], 1e-9)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"paper / scenario default: {ratio:.1f}x; peak RSS {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
