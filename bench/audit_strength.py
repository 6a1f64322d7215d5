"""How strong the audit is: the verdict beside each single attack, per model, batch and state.

For each model (``--models``), batch size (``--batches``) and state
(``untrained``: the scenario's init; ``trained``: after the quickstart's 5
rounds, the ``model.pt`` of ``fedsim run quickstart --set model.name=M --set
audit.enabled=false``, trained once and kept under ``--out``), the portfolio
that ``audit.attacks = "auto"`` resolves for a FedAvg probe at that batch size
(:func:`fedsim.scenario.portfolio.resolve_attacks`, its budgets and early
stopping) attacks the same ``--victims`` batches of unseen embedded MNIST
digits. Per cell and attack: median PSNR / SSIM / label accuracy over the
victims, seconds per victim (one thread) and the converged share; and the
verdict (per victim the best of the attacks, then the median), with the attack
that reached it most often. A verdict PSNR below 15 dB (or the flat-image
baseline) means the portfolio found nothing in that cell.

Usage: ``python bench/audit_strength.py [--models lenet5-split lenet-zhu]
[--batches 1 4 16] [--states untrained trained] [--victims 4]
[--out runs/audit-strength]``; prints a markdown table, writes
``audit_strength.csv``. State the load beside the seconds.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

from fedsim.attacks.base import AttackSetting
from fedsim.audit.experiment import AttackExperiment, run_attack_experiment
from fedsim.core.scenario_file import load_scenario
from fedsim.outputs.run_folder import MODEL_FILE
from fedsim.scenario.portfolio import resolve_attacks
from fedsim.strategies import STRATEGIES

REPO = Path(__file__).resolve().parents[1]
INIT = {"lenet-zhu": "uniform", "lenet-sapag": "uniform"}  # the rest: the zoo's default
SEED = 303  # images the tests do not draw


def trained_weights(model: str, out: Path) -> Path:
    """``model.pt`` after the quickstart's 5 rounds with ``model``, trained once."""
    run = out / f"trained-{model}"
    if not (run / MODEL_FILE).is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "fedsim.cli",
                "run",
                "quickstart",
                "--set",
                f"model.name={model}",
                "--set",
                f"model.init={INIT.get(model, 'default')}",
                "--set",
                "audit.enabled=false",
                "--out",
                str(run),
                "--force",
            ],
            check=True,
            cwd=REPO,
        )
    return run / MODEL_FILE


def cell(model: str, batch: int, weights: Path | None, victims: int) -> list[dict[str, object]]:
    """Every portfolio attack on the cell's victims, then the verdict row."""
    scenario = load_scenario(
        REPO / "scenarios" / "quickstart.toml",
        [
            f"model.name={model}",
            f"model.init={INIT.get(model, 'default')}",
            f"audit.probe-batch-size={batch}",
        ],
    )
    uploads = STRATEGIES.get("fedavg").shared_prefixes
    attacks = resolve_attacks(scenario.audit, AttackSetting.of(scenario, uploads))
    rows, best, reached, seconds = [], [float("-inf")] * victims, [""] * victims, 0.0
    best_ssim, best_labels = [float("-inf")] * victims, [float("-inf")] * victims
    for attack in attacks:
        params = {k: v for k, v in attack.table().items() if k != "unroll"}
        experiment = AttackExperiment(
            attack=attack.name,
            params=params,
            dataset="mnist-embedded",
            model=model,
            init=INIT.get(model, "default"),
            weights=None if weights is None else str(weights),
            batch_size=batch,
            num_images=victims * batch,
            seed=SEED,
        )
        outcome = run_attack_experiment(experiment)
        recs, scores = outcome.reconstructions, outcome.scores
        per_victim = sum(r.seconds for r in recs) / len(recs)
        seconds += per_victim
        for v, s in enumerate(scores):
            if s.psnr > best[v]:
                best[v], reached[v] = s.psnr, attack.name
            best_ssim[v] = max(best_ssim[v], s.ssim)
            best_labels[v] = max(best_labels[v], s.label_accuracy)
        rows.append(
            {
                "attack": attack.name,
                "budget": attack.table().get("steps", ""),
                "psnr": statistics.median(s.psnr for s in scores),
                "ssim": statistics.median(s.ssim for s in scores),
                "label-acc": statistics.median(s.label_accuracy for s in scores),
                "seconds": per_victim,
                "converged": sum(r.converged for r in recs) / len(recs),
            }
        )
        print(model, batch, "trained" if weights else "untrained", rows[-1], flush=True)
    strongest, count = Counter(reached).most_common(1)[0]
    rows.insert(
        0,
        {
            "attack": f"VERDICT ({strongest} {count}/{victims})",
            "budget": "",
            "psnr": statistics.median(best),
            "ssim": statistics.median(best_ssim),
            "label-acc": statistics.median(best_labels),
            "seconds": seconds,
            "converged": min(float(r["converged"]) for r in rows),  # type: ignore[arg-type]
        },
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["lenet5-split", "lenet-zhu"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--states", nargs="+", default=["untrained", "trained"])
    parser.add_argument("--victims", type=int, default=4)
    parser.add_argument("--out", default="runs/audit-strength")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    table = []
    for model in args.models:
        for state in args.states:
            weights = trained_weights(model, out) if state == "trained" else None
            for batch in args.batches:
                for row in cell(model, batch, weights, args.victims):
                    table.append({"model": model, "state": state, "batch": batch, **row})
    with open(out / "audit_strength.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    print(
        "\n| model | state | batch | attack | steps | PSNR | SSIM | labels | s/victim | converged |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r['model']} | {r['state']} | {r['batch']} | {r['attack']} | {r['budget']} "
            f"| {r['psnr']:.2f} | {r['ssim']:.3f} | {r['label-acc']:.2f} | {r['seconds']:.1f} "
            f"| {r['converged']:.0%} |"
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
