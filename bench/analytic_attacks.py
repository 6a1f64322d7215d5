"""Analytic attacks: seconds per victim on one CPU thread, PSNR, and where each applies.

Every case attacks FedSGD updates (one SGD step, lr 0.05, on a batch of real
``mnist-embedded`` test digits in [0, 1]) under fresh victim models, one per
victim, as ``fedsim attack --shared update`` builds them. Per case: the median
seconds per victim (``read s``: with the feature inversion switched off, the
analytic part; ``total s``: with the attack's defaults), the median PSNR (peak
1 on [0, 1]), the share of victims whose every image exceeds 40 dB, and
``applies``: whether :meth:`check_setting` accepts the matching audited
scenario, else its one-line refusal. With ``--audit-run``, instead: an
``mlp-2nn`` FedSGD federation audited by ``analytic-fc`` on every client in
every round (``victims = 0``) against the same run unaudited, alternately, in
one process::

    .venv/bin/python bench/analytic_attacks.py [--victims 8] [--audit-run --repeats 3]

``--attacks rgap spear box-vertices`` keeps only the named attacks' rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from fedsim.audit.experiment import AttackExperiment, run_attack_experiment
from fedsim.core.config import ScenarioError
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.scenario.validate import check_components
from fedsim.simulation.runner import run_scenario

EXACT_DB = 40.0


@dataclasses.dataclass(frozen=True)
class Case:
    """One attack on one architecture at one batch size."""

    attack: str
    model: str
    batch: int
    image_size: int = 28
    init: str = "default"
    victims: int | None = None  # None: --victims
    read_only: dict[str, Any] = dataclasses.field(default_factory=dict)  # params: no inversion


CASES = (
    Case("analytic-fc", "mlp-2nn", 1),
    Case("analytic-fc", "cnn-fedavg", 1, read_only={"inversion-steps": 0}),
    Case("analytic-fc", "lenet5-split", 1, 32, read_only={"inversion-steps": 0}),
    Case("analytic-fc", "lenet-zhu", 1, 32, read_only={"inversion-steps": 0}),
    Case("analytic-fc", "mlp-2nn", 8),
    *(Case("spear", "mlp-2nn", b) for b in (1, 2, 4, 8, 12, 16)),
    Case("spear", "lenet5-split", 1, 32),
    *(Case("box-vertices", "mlp-2nn", b) for b in (8, 16, 24, 32)),
    Case("box-vertices", "lenet5-split", 1, 32),
    Case("rgap", "lenet-zhu", 1, 32),
    Case("rgap", "lenet-zhu", 1, 32, init="uniform"),
    Case("rgap", "mlp-2nn", 1),
)


def scenario_table(case: Case) -> dict[str, Any]:
    """The audited FedAvg scenario of ``case``: every client, every round, FedSGD."""
    return {
        "name": "analytic-bench",
        "federation": {"num-clients": 4, "rounds": 5, "seed": 0},
        "data": {"dataset": "mnist-embedded", "image-size": case.image_size, "normalize": True},
        "model": {"name": case.model, "init": case.init},
        "strategy": {"name": "fedavg"},
        "client": {"local-steps": 1, "batch-size": case.batch, "optimizer": "sgd", "lr": 0.05},
        "audit": {"enabled": True, "attacks": [{"name": case.attack}], "victims": 0},
    }


def applies(case: Case) -> str:
    """``yes``, or the scenario check's one-line refusal."""
    try:
        check_components(scenario_from_dict(scenario_table(case)))
    except ScenarioError as refusal:
        return str(refusal.allowed)
    return "yes"


def attack_row(case: Case, victims: int) -> dict[str, Any]:
    """One table row: applicability, then (where it applies) times and scores.

    The victims are ``fedsim attack``'s (:func:`~fedsim.audit.experiment.run_attack_experiment`):
    seeded digits, one fresh model per batch, a one-step SGD update each. Seconds are
    each reconstruction's own; the median keeps the process's first (warm-up) call out.
    """
    verdict = applies(case)
    row: dict[str, Any] = {"case": case, "applies": verdict}
    if verdict != "yes":
        return row
    count = case.victims or victims
    experiment = AttackExperiment(
        attack=case.attack,
        dataset="mnist-embedded",
        model=case.model,
        init=case.init,
        batch_size=case.batch,
        num_images=count * case.batch,
        shared="update",
        image_size=case.image_size,
        device="cpu",
        threads=1,
    )
    outcome = run_attack_experiment(experiment)
    read = outcome.medians()["seconds"]
    if case.read_only:
        quick = dataclasses.replace(experiment, params=case.read_only)
        read = run_attack_experiment(quick).medians()["seconds"]
    row.update(
        read=read,
        total=outcome.medians()["seconds"],
        psnr=outcome.medians()["psnr"],
        exact=sum(min(s.per_image_psnr) > EXACT_DB for s in outcome.scores) / count,
        labels=statistics.mean(s.label_accuracy for s in outcome.scores),
        victims=count,
    )
    return row


def print_attack_table(rows: list[dict[str, Any]]) -> None:
    columns = ("attack", "model", "init", "batch", "victims", "read s", "total s")
    columns += ("PSNR dB", "exact", "labels", "applies")
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for row in rows:
        c = row["case"]
        head = f"| {c.attack} | {c.model} | {c.init} | {c.batch} |"
        if row["applies"] != "yes":
            print(f"{head} | | | | | | refused: {row['applies']} |")
            continue
        print(
            f"{head} {row['victims']} | {row['read']:.3f} | {row['total']:.3f} | "
            f"{row['psnr']:.1f} | {row['exact']:.0%} | {row['labels']:.0%} | yes |"
        )


def audit_run(repeats: int, rounds: int) -> None:
    """Wall time of the audited mlp-2nn FedSGD run over the unaudited one, alternately."""
    case = Case("analytic-fc", "mlp-2nn", 1)
    table = scenario_table(case)
    table["federation"] = {**table["federation"], "rounds": rounds}
    table["data"] = {**table["data"], "samples-per-client": 200}
    walls: dict[str, list[float]] = {"off": [], "audited": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats + 1):  # the first pair warms the process up, unrecorded
            for mode in ("off", "audited"):
                audit = {**table["audit"], "enabled": mode == "audited"}
                scenario = scenario_from_dict({**table, "audit": audit})
                started = time.perf_counter()
                run_scenario(scenario, Path(tmp) / f"{mode}-{r}")
                if r:
                    walls[mode].append(time.perf_counter() - started)
    ratios = [a / o for a, o in zip(walls["audited"], walls["off"], strict=True)]
    print(f"\nmlp-2nn FedSGD, 4 clients, {rounds} rounds, analytic-fc on every client every round")
    print("| run | wall s (median) | all |\n|---|---|---|")
    for mode, values in walls.items():
        every = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {mode} | {statistics.median(values):.2f} | {every} |")
    every = ", ".join(f"{x:.3f}" for x in ratios)
    print(f"audited / off: median {statistics.median(ratios):.3f} ({every})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--victims", type=int, default=8)
    parser.add_argument("--attacks", nargs="+", help="only these attacks' rows")
    parser.add_argument("--audit-run", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if args.audit_run:
        audit_run(args.repeats, args.rounds)
        return
    torch.set_num_threads(1)
    cases = [c for c in CASES if not args.attacks or c.attack in args.attacks]
    print_attack_table([attack_row(case, args.victims) for case in cases])


if __name__ == "__main__":
    main()
