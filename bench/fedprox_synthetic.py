"""The FedProx paper's synthetic experiments (Li et al., MLSys 2020, Figure 2), as one sweep.

Synthetic-IID, Synthetic(0,0), (0.5,0.5) and (1,1) (``data.dataset = "synthetic"``);
30 devices, 10 sampled per round, E = 20 local epochs, batch 10, SGD at lr 0.01,
multinomial logistic regression (``logreg``); 0 %, 50 % and 90 % stragglers
(``federation.stragglers``: they do 1..E epochs; FedAvg drops them, FedProx
aggregates them); FedAvg, FedProx with mu = 0 and with mu = 1. At 0 % stragglers
FedProx(mu = 0) is FedAvg exactly (``tests/test_fedprox.py``), so that cell runs
FedAvg and FedProx(mu = 1) only.

Every cell is a fedsim run: the script writes one ``fedsim compare`` spec (a
strategy entry per cell) and runs it, so a rerun resumes where it stopped. Per
round it reads ``client-eval-loss`` and ``client-eval-acc``: the global model on
every device's local test split, example-weighted. The accuracy is the paper's
test accuracy; the paper's training loss is the global model on the devices'
training data, which fedsim does not evaluate, so the loss shown is the same
model's loss on the devices' held-out 20 %. Beside them, the server's ``test-acc``
(100 fresh examples of each device: every device weighs alike). alpha and beta are standard
deviations (``scale = "std"``), as the FedProx code that drew the paper's
figures passes them to ``np.random.normal``. Writes a figure per data set (loss
and accuracy per round, a column per straggler share), the table as markdown,
and every series as JSON::

    .venv/bin/python bench/fedprox_synthetic.py --rounds 20 [--out runs/fedprox-synthetic]
    .venv/bin/python bench/fedprox_synthetic.py --rounds 20 --report-only
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import pandas as pd
import tomli_w
from matplotlib.figure import Figure

from fedsim.core import protocol
from fedsim.outputs.run_folder import METRICS_FILE
from fedsim.sweeps.runs import MARKER
from fedsim.sweeps.spec import slug

ROOT = Path(__file__).resolve().parent.parent
SPEC_NAME = "fedprox-synthetic"
DATASETS: dict[str, dict[str, Any]] = {
    "Synthetic-IID": {"iid": True},
    "Synthetic(0,0)": {"alpha": 0.0, "beta": 0.0},
    "Synthetic(0.5,0.5)": {"alpha": 0.5, "beta": 0.5},
    "Synthetic(1,1)": {"alpha": 1.0, "beta": 1.0},
}
METHODS: dict[str, dict[str, Any]] = {
    "FedAvg": {"name": "fedavg"},
    "FedProx mu=0": {"name": "fedprox", "proximal-mu": 0.0},
    "FedProx mu=1": {"name": "fedprox", "proximal-mu": 1.0},
}
STRAGGLERS = (0.0, 0.5, 0.9)
# The sweep runs the claim's cells first (90 %, then the 0 % baseline; the most
# heterogeneous data and the IID control first), so that a sweep stopped early has them.
RUN_ORDER = (0.9, 0.0, 0.5)
DATA_ORDER = ("Synthetic(1,1)", "Synthetic-IID", "Synthetic(0.5,0.5)", "Synthetic(0,0)")
LOSS, ACC = protocol.CLIENT_EVAL_LOSS, protocol.CLIENT_EVAL_ACC
COLOURS = {"FedAvg": "tab:green", "FedProx mu=0": "tab:blue", "FedProx mu=1": "tab:red"}


def cells() -> list[tuple[str, float, str]]:
    """(data set, straggler share, method) of every run; FedProx(mu=0) = FedAvg at 0 %."""
    return [
        (data, share, method)
        for data in DATASETS
        for share in STRAGGLERS
        for method in METHODS
        if not (share == 0 and method == "FedProx mu=0")
    ]


def label(data: str, share: float, method: str) -> str:
    return f"{data} {round(share * 100)}% {method}"


def spec(rounds: int, seed: int) -> dict[str, Any]:
    """The ``fedsim compare`` spec: the paper's setting as the base, a strategy entry per cell."""
    base = {
        "name": SPEC_NAME,
        "federation": {"num-clients": 30, "clients-per-round": 10, "rounds": rounds, "seed": 0},
        "data": {"dataset": "synthetic"},
        "model": {"name": "logreg"},
        "client": {"local-epochs": 20, "batch-size": 10, "optimizer": "sgd", "lr": 0.01},
        "backend": {"num-cpus": 1},
    }
    entries = [
        {
            "label": label(data, share, method),
            "strategy": METHODS[method],
            "overrides": {
                "federation": {"stragglers": share},
                "data": {
                    "generator": {**DATASETS[data], "scale": "std", "test-devices": 30},
                },
            },
        }
        for data, share, method in sorted(
            cells(), key=lambda c: (RUN_ORDER.index(c[1]), DATA_ORDER.index(c[0]))
        )
    ]
    return {
        "name": SPEC_NAME,
        "description": "The FedProx paper's synthetic experiments (Figure 2).",
        "seeds": [seed],
        "parallel": 1,
        "accuracy": ACC,
        "base": base,
        "strategies": entries,
    }


def series(out: Path, seed: int) -> dict[str, dict[str, list[float]]]:
    """Each finished cell's loss and accuracy per round (cells not finished are left out)."""
    found = {}
    for cell in cells():
        run_dir = out / "runs" / slug(label(*cell)) / f"seed-{seed}"
        if (run_dir / MARKER).is_file():  # the sweep marks a run finished
            frame = pd.read_csv(run_dir / METRICS_FILE)
            found[label(*cell)] = {
                "loss": list(frame[LOSS]),
                "acc": list(frame[ACC]),
                "device-mean-acc": list(frame[protocol.TEST_ACC]),
            }
    return found


def figure(data: str, found: dict[str, dict[str, list[float]]], path: Path) -> None:
    """Loss (top) and accuracy (bottom) per round, a column per straggler share that ran."""
    shares = [s for s in STRAGGLERS if any(label(data, s, m) in found for m in METHODS)]
    if not shares:
        return
    fig = Figure(figsize=(4 * len(shares), 6.5), layout="constrained")
    axes = fig.subplots(2, len(shares), sharex=True, sharey="row", squeeze=False)
    for column, share in enumerate(shares):
        for method in METHODS:
            runs = found.get(label(data, share, method))
            if runs is None:
                continue
            rounds = range(1, len(runs["loss"]) + 1)
            style = {"color": COLOURS[method], "label": method, "linewidth": 1.4}
            axes[0, column].plot(rounds, runs["loss"], **style)
            axes[1, column].plot(rounds, runs["acc"], **style)
        axes[0, column].set_title(f"{data}, {round(share * 100)}% stragglers")
        axes[1, column].set_xlabel("round")
    axes[0, 0].set_ylabel("loss, global model (devices' data)")
    axes[1, 0].set_ylabel("test accuracy (devices' data)")
    for axis in axes[0]:
        if axis.lines:
            axis.legend(fontsize=8)
    fig.savefig(path, dpi=90)


def table(found: dict[str, dict[str, list[float]]]) -> str:
    """The README table: final and best loss and accuracy per cell, the largest rise of the
    loss from one round to the next (how unstable the run is), and the final accuracy on the
    server's test set, which weighs every device alike (100 fresh examples of each)."""
    lines = [
        "| data | stragglers | method | final loss | min loss | largest loss rise "
        "| final acc | best acc | final device-mean acc |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells():
        runs = found.get(label(*cell))
        if runs is None:
            continue
        data, share, method = cell
        loss, acc = runs["loss"], runs["acc"]
        shown = [
            f"{loss[-1]:.3f}" if math.isfinite(loss[-1]) else "diverged",
            f"{min(loss):.3f}",
            f"{max(0.0, *(b - a for a, b in pairwise(loss))):.3f}",  # 0: it never rose
            f"{acc[-1]:.3f}",
            f"{max(acc):.3f}",
            f"{runs['device-mean-acc'][-1]:.3f}",
        ]
        lines.append(f"| {data} | {round(share * 100)}% | {method} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds per run (the paper: 200)")
    parser.add_argument("--seed", type=int, default=0, help="federation.seed: sampling, stragglers")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / SPEC_NAME, help="sweep folder")
    parser.add_argument(
        "--results", type=Path, default=ROOT / "bench" / "results", help="table and series"
    )
    parser.add_argument("--figures", type=Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--report-only", action="store_true", help="read a sweep, run nothing")
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    spec_file = args.out / "spec.toml"
    spec_file.write_text(tomli_w.dumps(spec(args.rounds, args.seed)))
    if not args.report_only:
        command = [sys.executable, "-m", "fedsim.cli", "compare", str(spec_file), "--out"]
        subprocess.run([*command, str(args.out)], check=True)

    found = series(args.out, args.seed)
    args.results.mkdir(parents=True, exist_ok=True)
    args.figures.mkdir(parents=True, exist_ok=True)
    for data in DATASETS:
        figure(data, found, args.figures / f"fedprox-{slug(data)}.png")
    text = table(found)
    (args.results / "fedprox_synthetic.md").write_text(text + "\n")
    (args.results / "fedprox_synthetic.json").write_text(json.dumps(found, indent=1))
    print(text)


if __name__ == "__main__":
    main()
