"""Seconds per round of FedCG's server distillation on CPU, FMNIST(4) shapes.

Times :func:`fedsim.strategies.distillation.distill` with four client teachers
(``lenet5-split`` at 32x32, 10 classes, the 16x5x5 feature generator) at the
paper's 2,000 iterations and at the default of ``scenarios/fmnist4-fedcg.toml``,
and prints the median of ``--repeats`` runs of each, their ratio and the peak
memory. Timing does not depend on the weights, so teachers are freshly built.

Run: ``.venv/bin/python bench/fedcg_distillation.py [--repeats 3] [--threads N]``
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
import tomllib
from pathlib import Path

import torch

from fedsim.core.config import ComponentConfig, ModelConfig, component_params
from fedsim.core.gan import build_gan_split_net
from fedsim.core.models import InputSpec
from fedsim.strategies.distillation import Teacher, distill
from fedsim.strategies.fedcg import FedCG, FedCGParams

PAPER_ITERATIONS = 2000
SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "fmnist4-fedcg.toml"


def scenario_params() -> FedCGParams:
    """The FedCG parameters the FMNIST(4) scenario sets (no data needed)."""
    table = dict(tomllib.loads(SCENARIO.read_text())["strategy"])
    name = table.pop("name")
    params: FedCGParams = component_params(FedCG, ComponentConfig(name, table), "strategy")
    return params


def seconds(iterations: int, batch_size: int, lr: float, clients: int) -> float:
    """Wall seconds of one distillation round from ``clients`` teachers."""
    model, spec = ModelConfig("lenet5-split"), InputSpec(1, 32, 10)
    teachers = [
        Teacher(1.0 / clients, build_gan_split_net(model, spec, seed=1 + i)) for i in range(clients)
    ]
    student = build_gan_split_net(model, spec, seed=0)
    started = time.perf_counter()
    distill(student, teachers, iterations, batch_size, lr, seed=0)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = scenario_params()
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
