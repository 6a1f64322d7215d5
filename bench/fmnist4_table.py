"""FedCG's FMNIST(4) table: local, FedAvg, FedProx, FedSplit and FedCG at one budget.

Runs the five ``scenarios/fmnist4-*.toml`` scenarios one after another, each
as its own ``fedsim run`` process (its own Ray session), and prints, beside
the paper's Table 1, the mean client accuracy on the clients' local test
splits (``client-eval-acc``: personalised for local/FedSplit/FedCG, the global
model for FedAvg/FedProx) after the last round and the best over rounds (the
paper reports the best), the held-out test accuracy where a global model
exists, and the wall time::

    .venv/bin/python bench/fmnist4_table.py [--out runs/fmnist4] [--set federation.rounds=2]

``--report-only`` re-reads finished run directories. Needs Debian's
``dataset-fashion-mnist`` in ``/usr/share/datasets/fashion-mnist``.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
PAPER = {"local": 79.66, "fedavg": 82.97, "fedprox": 83.61, "fedsplit": 81.95, "fedcg": 83.81}


def run(name: str, out: Path, overrides: list[str]) -> float:
    """Run one scenario into ``out``; return its wall seconds (start-up included)."""
    command = [str(Path(sys.executable).parent / "fedsim"), "run"]
    command += [str(ROOT / "scenarios" / f"fmnist4-{name}.toml"), "--out", str(out)]
    for override in overrides:
        command += ["--set", override]
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - started


def percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.2f}"


def row(name: str, out: Path, wall: float) -> str:
    metrics = pd.read_csv(out / "metrics.csv")
    accuracy = metrics["client-eval-acc"]
    test = float(metrics["test-acc"].iloc[-1])
    return (
        f"| {name} | {PAPER[name]:.2f} | {percent(accuracy.iloc[-1])} | {percent(accuracy.max())} "
        f"| {percent(test)} | {len(metrics)} | {metrics['seconds'].mean():.1f} "
        f"| {metrics['seconds'].iloc[1:].mean():.1f} | {wall:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "fmnist4")
    parser.add_argument("--only", nargs="+", choices=list(PAPER), default=list(PAPER))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    walls = {}
    for name in args.only:
        walls[name] = math.nan if args.report_only else run(name, args.out / name, args.overrides)
    print(
        "\n| strategy | paper (%) | last round (%) | best round (%) | held-out test (%) "
        "| rounds | s/round | s/round after 1st | wall s |\n|---|---|---|---|---|---|---|---|---|"
    )
    for name in args.only:
        print(row(name, args.out / name, walls[name]))


if __name__ == "__main__":
    main()
