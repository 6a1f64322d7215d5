"""The audit across strategies and what it costs.

Runs ``scenarios/audit-{fedavg,fedprox,fedsplit,fedcg}.toml`` (same data,
model, seed and DLG budget) and prints each round's mean PSNR / SSIM; then
runs the FedAvg scenario with the audit synchronous, asynchronous and off,
and prints the wall time of each and the ratios to "off".

Usage: ``.venv/bin/python bench/audit_cost.py [--rounds 3] [--steps 100]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from fedsim.core.scenario_file import load_scenario
from fedsim.simulation.runner import run_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def run(name: str, out: Path, overrides: list[str]) -> tuple[float, Path]:
    scenario = load_scenario(SCENARIOS / f"audit-{name}.toml", overrides)
    started = time.perf_counter()
    result = run_scenario(scenario, out)
    return time.perf_counter() - started, result.run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--restarts", type=int, default=4)
    args = parser.parse_args()
    attack = f"audit.attacks=[{{name='dlg', steps={args.steps}, restarts={args.restarts}}}]"
    base = [f"federation.rounds={args.rounds}", attack]
    tables: list[pd.DataFrame] = []
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in ("fedavg", "fedprox", "fedsplit", "fedcg"):
            _, run_dir = run(strategy, Path(tmp) / strategy, base)
            audit = pd.read_csv(run_dir / "audit.csv")
            per_round = audit.groupby("round")[["psnr", "ssim", "label-acc", "seconds"]].mean()
            per_round.insert(0, "strategy", strategy)
            tables.append(per_round.reset_index())
        # Timed after the runs above, so process warm-up (imports, compilation) is paid.
        modes: tuple[tuple[str, list[str]], ...] = (
            ("off", ["audit.enabled=false"]),
            ("sync", []),
            ("async", ["audit.mode=async"]),
        )
        for mode, extra in modes:
            walls[mode], _ = run("fedavg", Path(tmp) / mode, base + extra)
    print(f"\nDLG: {args.steps} L-BFGS steps x {args.restarts} restarts, 1 victim per round\n")
    print(pd.concat(tables).to_markdown(index=False, floatfmt=".2f"))  # via tabulate
    print("\n| audit | wall s | / off |\n|---|---|---|")
    for mode in ("off", "sync", "async"):
        print(f"| {mode} | {walls[mode]:.1f} | {walls[mode] / walls['off']:.2f} |")


if __name__ == "__main__":
    main()
