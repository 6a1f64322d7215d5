"""What one round of each FedCG Table 1 method costs under ``--protocol paper``, and which
``bench/paper_tables.py --budget`` fits a wall-clock limit.

Per-step costs come from the real training code on one thread (as a Ray client
actor with ``num-cpus = 1`` runs): a stage-1 step of FedAvg / Local / FedSplit
(plain cross-entropy), of FedProx (proximal term) and of FedCG (cross-entropy
plus the generator's MSE target), a FedCG GAN step, a server distillation
iteration (4 teachers, batch 8) and the evaluation of one image, all at batch 8
on the paper protocol's data (Fashion-MNIST at 32x32, ``Normalize(0.5, 0.5)``).
A run's fixed cost (Ray start, data, the final model, the Table 2 audit of the
last round) is measured by one real 1-round, 1-step ``fedsim`` run with the
audit and one without.

The sweep model: 4 clients on ``--cores`` cores (one client per core, clients of a
round in ``ceil(4 / cores)`` waves), the server's distillation after them; a
round of a client is ``epochs x 250`` steps (2,000 images, batch 8) of its
stage 1 (FedCG: plus as many GAN steps), the evaluation of its 2,500 validation
and test images right after training and of its 1,250 test images in the
evaluate phase; FedAvg's and FedProx's server tests the global model on the
10,000 test images every round. Rows: Local, FedAvg, FedProx, FedSplit, FedCG and FedAvg + DP
twice (FedAvg's cost); FedAvg, FedSplit and FedCG carry the audit. The script
prints the costs, the sweep's estimate at each candidate budget and the largest
budget whose sweep fits ``--minutes``::

    .venv/bin/python bench/fedcg_round_cost.py --minutes 90 --cores 2 --seeds 3

``--audit full`` prices ``paper_tables.py --audit full`` instead: Table 2's rows only
(FedAvg, the two DP rows, FedSplit, FedCG), every one audited, the audited run's
fixed cost measured with that full audit (every attack on the probe, every leak kind)::

    .venv/bin/python bench/fedcg_round_cost.py --audit full --minutes 90 --cores 2 --seeds 3

Needs Debian's ``dataset-fashion-mnist`` (``make fmnist``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper_tables import (
    AUDITS,
    CODE_DISTILL_PER_EPOCH,
    FULL_AUDIT,
    PAPER_CLIENT,
    PAPER_DATA,
    SCENARIOS,
    Budget,
)

from fedsim.clients.fedcg import TaskLoss, train_gan
from fedsim.clients.fedprox import proximal_loss
from fedsim.core.data import load_dataset
from fedsim.core.gan import build_gan_split_net
from fedsim.core.models import InputSpec, build_model
from fedsim.core.scenario_file import read_toml, scenario_from_dict
from fedsim.core.training import evaluate, train_local
from fedsim.simulation.runner import run_scenario
from fedsim.strategies.distillation import Teacher, distill
from fedsim.sweeps.spec import merge

CLIENTS, TRAIN_IMAGES, BATCH, VAL_TEST_IMAGES, TEST_IMAGES = 4, 2000, 8, 2500, 1250
STEPS_PER_EPOCH = TRAIN_IMAGES // BATCH
ROWS = ("Local", "FedAvg", "FedProx", "FedSplit", "FedCG", "DP 0.001", "DP 0.1")
AUDITED = ("FedAvg", "FedSplit", "FedCG")
TABLE2_ROWS = ("FedAvg", "FedSplit", "FedCG", "DP 0.001", "DP 0.1")  # --audit full: all audited
GLOBAL_MODEL = ("FedAvg", "FedProx", "DP 0.001", "DP 0.1")
HELD_OUT_IMAGES = 10_000


def paper_scenario(rounds: int, client: dict[str, object]) -> dict[str, Any]:
    """``fmnist4-fedavg`` under the paper protocol, ``client`` keys changed."""
    base = read_toml(SCENARIOS / "fmnist4-fedavg.toml", "scenario")
    base = merge(base, {"data": PAPER_DATA, "client": PAPER_CLIENT | client})
    return merge(base, {"federation": {"rounds": rounds}})


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``fn`` (one warm-up call first)."""
    fn()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def step_costs(steps: int) -> dict[str, float]:
    """Seconds per step of each kind, one thread."""
    torch.set_num_threads(1)
    scenario = scenario_from_dict(paper_scenario(1, {"local-steps": steps}))
    bundle = load_dataset(scenario.data)
    images, labels = bundle.train_images[:TRAIN_IMAGES], bundle.train_labels[:TRAIN_IMAGES]
    spec = InputSpec(bundle.channels, bundle.image_size, bundle.num_classes)
    net = build_gan_split_net(scenario.model, spec, seed=0)
    plain = build_model(scenario.model, spec, seed=0)
    cfg = scenario.client
    generator = build_gan_split_net(scenario.model, spec, seed=1).generator.eval()
    costs = {
        "ce-step": per_call(lambda: train_local(net, images, labels, cfg, 0), 2) / steps,
        # FedProx trains the plain model: its proximal term over FedCG's GAN would
        # cover the generator's 1.6 M weights too (a step 4x too dear).
        "fedprox-step": per_call(
            lambda: train_local(plain, images, labels, cfg, 0, proximal_loss(plain, 0.01)), 2
        )
        / steps,
        "fedcg-step": per_call(
            lambda: train_local(net, images, labels, cfg, 0, TaskLoss(net, generator, 0.5)), 2
        )
        / steps,
        "gan-step": per_call(lambda: train_gan(net, images, labels, cfg, 0, 0.0), 2) / steps,
    }
    teachers = [Teacher(0.25, build_gan_split_net(scenario.model, spec, s)) for s in range(4)]
    costs["distill-iteration"] = (
        per_call(lambda: distill(net, teachers, steps, BATCH, 3e-4, 0, train_mode=True), 2) / steps
    )
    costs["eval-image"] = per_call(lambda: evaluate(net, images, labels), 3) / TRAIN_IMAGES
    return costs


def run_overhead(audited: bool, audit_kind: str = "dlg") -> float:
    """Wall seconds of a real 1-round, 1-step fedsim run (Ray, data, model, audit: DLG on
    the probe, or with ``audit_kind = "full"`` ``paper_tables.py --audit full``'s)."""
    table = paper_scenario(1, {"local-steps": 1})
    if audited and audit_kind == "full":
        table["audit"] = FULL_AUDIT | {"rounds": [1], "probe-rounds": [1]}
    elif audited:
        audit = dict(read_toml(SCENARIOS / "compare-table2.toml", "spec")["base"]["audit"])
        table["audit"] = audit | {"rounds": [1]}
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        run_scenario(scenario_from_dict(table), Path(folder) / "run", console=Console(quiet=True))
        return time.perf_counter() - started


def round_seconds(row: str, epochs: int, costs: dict[str, float], cores: int) -> float:
    """One round of ``row`` at ``epochs`` local epochs."""
    step = {"FedProx": "fedprox-step", "FedCG": "fedcg-step"}.get(row, "ce-step")
    client = epochs * STEPS_PER_EPOCH * costs[step]
    if row == "FedCG":
        client += epochs * STEPS_PER_EPOCH * costs["gan-step"]
    client += (VAL_TEST_IMAGES + TEST_IMAGES) * costs["eval-image"]
    server = 0.0
    if row == "FedCG":
        server = CODE_DISTILL_PER_EPOCH * epochs * costs["distill-iteration"]
    if row in GLOBAL_MODEL:  # the server tests the global model on the 10,000 test images
        server = HELD_OUT_IMAGES * costs["eval-image"]
    return math.ceil(CLIENTS / cores) * client + server


def sweep_seconds(
    budget: Budget,
    costs: dict[str, float],
    overheads: dict[bool, float],
    cores: int,
    seeds: int,
    audit_kind: str = "dlg",
) -> float:
    rows, audited = (TABLE2_ROWS, TABLE2_ROWS) if audit_kind == "full" else (ROWS, AUDITED)
    per_seed = sum(
        budget.rounds * round_seconds(row, budget.epochs, costs, cores) + overheads[row in audited]
        for row in rows
    )
    return seeds * per_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=90.0)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="steps timed per kind")
    parser.add_argument("--audit", choices=AUDITS, default="dlg", help="price paper_tables' mode")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    costs = step_costs(args.steps)
    for name, seconds in costs.items():
        print(f"{name:>18}: {1000 * seconds:8.2f} ms")
    overheads = {False: run_overhead(False), True: run_overhead(True, args.audit)}
    print(f"run overhead: {overheads[False]:.1f} s, audited {overheads[True]:.1f} s")
    print(f"load average after timing: {os.getloadavg()}")
    print("\none round (1 local epoch), seconds on", args.cores, "cores:")
    for row in ROWS[:5]:
        print(f"  {row:>8}: {round_seconds(row, 1, costs, args.cores):7.1f}")
    limit = 60 * args.minutes
    best = None
    print("\n| budget | rounds x epochs | sweep estimate (min) |\n|---|---|---|")
    seen: set[tuple[int, int]] = set()
    for step in range(1, 41):  # 0.0005 to 0.02: each distinct rounds x epochs once
        budget = Budget.of(step * 0.0005)
        fraction = budget.fraction
        if (budget.rounds, budget.epochs) in seen:
            continue
        seen.add((budget.rounds, budget.epochs))
        seconds = sweep_seconds(budget, costs, overheads, args.cores, args.seeds, args.audit)
        print(f"| {fraction:g} | {budget.rounds} x {budget.epochs} | {seconds / 60:.1f} |")
        if seconds <= limit:
            best = fraction
    print(f"\nlargest budget fitting {args.minutes:g} min: {best}")


if __name__ == "__main__":
    main()
