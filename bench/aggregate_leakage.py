"""Leakage against clients per round under secure aggregation's view (the aggregate threat model).

Each cell is a real fedsim run (:func:`fedsim.simulation.runner.run_scenario`,
Flower on Ray, as ``fedsim run``): ``mlp-2nn``, FedAvg of FedSGD clients (one
SGD step, lr 0.05, on each client's whole batch of ``--images-per-client``
embedded MNIST training digits), every client sampled every round, audited with
``audit.threat-model = "aggregate"`` and ``box-vertices``: one observation a
round, the example-weighted mean of the replies, scored against the union of
the summed clients' digits. Per clients-per-round (``--clients``), one run per
seed (``--seeds``, the federation's seed: other digits, another model), of
``--rounds`` rounds. Read from each run's own records: ``audit.csv``
(``images-recovered``: PSNR >= 20 dB, peak 1 on [0, 1], and SSIM >= 0.8;
``psnr``: the batch's mean per-image PSNR; ``seconds``), ``verdict.csv`` (the
strongest label analysis' total-variation distance: 1 - TV is the share of the
summed labels counted right), ``leaks.csv`` (the leak analyses' seconds) and
``metrics.csv`` (the round's own seconds: training and evaluation). Where the
sum exceeds ``box-vertices``' batch limit the audit runs no reconstruction:
the cell says ``refused`` and why. Rows (one per run and round) go to
``--out``/aggregate_leakage.csv, the figure to ``docs/figures/aggregate_leakage.png``::

    .venv/bin/python bench/aggregate_leakage.py --clients 1 2 4 8 16 --images-per-client 4 \
        --seeds 0 1 2 --out runs/aggregate-leakage

Measured (commit 79a87b3, 2 shared cores, no GPU; load 2.2 at the start, 1.9-3.8 while it
ran, mostly this run's own Ray workers; 3 seeds x 2 rounds a cell, 412 s in all, most of it
Ray's start-up in each of the 15 runs). Recovered: over the cell's 6 rounds; PSNR: the median
over the rounds of each round's mean per-image PSNR (exact recoveries score 100 dB and more);
labels: 1 - TV of the strongest label analysis (``gradient-count`` in every round); round s:
the federation's round (training, aggregation, the server's test; ``metrics.csv``), beside
which the audit runs; attack s and leak s: the audit's seconds a round for ``box-vertices``
and for the leak analyses (labels, membership, class representatives)::

    | clients | summed | recovered | share (seeds) | PSNR | labels | round s | attack s | leak s |
    |---|---|---|---|---|---|---|---|---|
    | 1 | 4 | 24 of 24 | 1.00 (1.00, 1.00, 1.00) | 135.5 | 1.00 | 0.12 | 0.10 | 1.50 |
    | 2 | 8 | 48 of 48 | 1.00 (1.00, 1.00, 1.00) | 126.0 | 1.00 | 0.13 | 0.26 | 2.00 |
    | 4 | 16 | 95 of 96 | 0.99 (0.97, 1.00, 1.00) | 115.1 | 1.00 | 0.18 | 1.43 | 1.41 |
    | 8 | 32 | 167 of 192 | 0.87 (0.91, 0.78, 0.92) | 86.6 | 1.00 | 0.24 | 15.67 | 1.41 |
    | 16 | 64 | refused: 64 > 32 | | | 1.00 | 0.43 | | 1.53 |
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from rich.console import Console

from fedsim.attacks.reconstruction.vertices import BoxVertices
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.outputs.run_folder import AUDIT_FILE, LEAKS_FILE, METRICS_FILE, VERDICT_FILE
from fedsim.simulation.runner import run_scenario

ROOT = Path(__file__).resolve().parents[1]
FIGURE = ROOT / "docs" / "figures" / "aggregate_leakage.png"
ATTACK = BoxVertices.registered_name()


def scenario_table(clients: int, images: int, seed: int, rounds: int) -> dict[str, Any]:
    """FedSGD on mlp-2nn, ``clients`` of ``images`` digits each, all summed every round."""
    return {
        "name": f"aggregate-{clients}x{images}-seed{seed}",
        "federation": {
            "num-clients": clients,
            "clients-per-round": clients,
            "rounds": rounds,
            "seed": seed,
            "evaluate-fraction": 0,
        },
        "data": {
            "dataset": "mnist-embedded",
            "image-size": 28,
            "samples-per-client": images,
            "test-fraction": 0,
        },
        "model": {"name": "mlp-2nn"},
        "strategy": {"name": "fedavg"},
        "client": {"local-steps": 1, "batch-size": images, "optimizer": "sgd", "lr": 0.05},
        "audit": {"enabled": True, "threat-model": "aggregate", "attacks": [{"name": ATTACK}]},
    }


def run_cell(clients: int, images: int, seed: int, rounds: int, out: Path) -> list[dict[str, Any]]:
    """One run; a row per round from its records."""
    console_text = io.StringIO()
    scenario = scenario_from_dict(scenario_table(clients, images, seed, rounds))
    started = time.perf_counter()
    result = run_scenario(
        scenario, out / f"clients-{clients}-seed-{seed}", Console(file=console_text, width=400)
    )
    wall = time.perf_counter() - started
    run_dir = result.run_dir
    audit = pd.read_csv(run_dir / AUDIT_FILE) if (run_dir / AUDIT_FILE).exists() else None
    verdict = pd.read_csv(run_dir / VERDICT_FILE).set_index("round")
    leaks = pd.read_csv(run_dir / LEAKS_FILE).groupby("round")["seconds"].sum()
    metrics = pd.read_csv(run_dir / METRICS_FILE).set_index("round")
    notes = [line.strip() for line in console_text.getvalue().splitlines()]
    rows = []
    for server_round in range(1, rounds + 1):
        summed = images * clients
        row: dict[str, Any] = {
            "clients": clients,
            "images-per-client": images,
            "seed": seed,
            "round": server_round,
            "images-summed": summed,
            "label-tv": verdict.at[server_round, "label-tv"],
            "label-analysis": verdict.at[server_round, "label-analysis"],
            "round-seconds": metrics.at[server_round, "seconds"],
            "leak-seconds": leaks.get(server_round, float("nan")),
            "run-wall-seconds": wall,
            "run-dir": str(run_dir),
        }
        mine = None if audit is None else audit[audit["round"] == server_round]
        if mine is not None and len(mine):
            (record,) = mine.to_dict("records")
            assert record["batch-size"] == summed, (record["batch-size"], summed)
            row.update(
                status="attacked",
                reason="",
                **{
                    key: record[key]
                    for key in ("images-recovered", "psnr", "ssim", "label-acc", "seconds")
                },
            )
            row["attack-seconds"] = row.pop("seconds")
        else:
            said = [n for n in notes if f"audit round {server_round}:" in n]
            reason = (
                f"{ATTACK} reads batches of at most {BoxVertices.max_batch}; "
                f"this one holds {summed}"
                if summed > BoxVertices.max_batch
                else "no audit.csv row"
            )
            row.update(status="refused", reason=reason, **{"audit-note": " ".join(said)})
        rows.append(row)
    return rows


def cell_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """One summary per clients-per-round."""
    cells = []
    for clients, group in frame.groupby("clients", sort=True):
        summed = int(group["images-summed"].iloc[0])
        cell: dict[str, Any] = {
            "clients": int(clients),
            "summed": summed,
            "runs": f"{group['seed'].nunique()} x {group['round'].nunique()}",
            "label-share": statistics.median(1 - group["label-tv"]),
            "label-analysis": "/".join(sorted(set(group["label-analysis"]))),
            "round-s": statistics.median(group["round-seconds"]),
            "leak-s": statistics.median(group["leak-seconds"]),
        }
        attacked = group[group["status"] == "attacked"]
        if len(attacked) < len(group):
            cell["refused"] = group.loc[group["status"] == "refused", "reason"].iloc[0]
        if len(attacked):
            per_seed = attacked.groupby("seed")["images-recovered"].sum() / (
                summed * attacked.groupby("seed").size()
            )
            cell.update(
                recovered=int(attacked["images-recovered"].sum()),
                of=summed * len(attacked),
                share=float(per_seed.mean()),
                seed_shares=list(per_seed),
                rounds_recovered=list(attacked["images-recovered"].astype(int)),
                psnr=statistics.median(attacked["psnr"]),
                attack_s=statistics.median(attacked["attack-seconds"]),
            )
        cells.append(cell)
    return cells


def markdown(cells: list[dict[str, Any]]) -> str:
    head = (
        "| clients / round | images summed | seeds x rounds | images recovered | share "
        "(per seed) | median PSNR | labels: 1 - TV | round s | box-vertices s | leaks s |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for c in cells:
        common = f"| {c['clients']} | {c['summed']} | {c['runs']} |"
        tail = f" {c['label-share']:.2f} | {c['round-s']:.2f} |"
        if "share" in c:
            seeds = ", ".join(f"{s:.2f}" for s in c["seed_shares"])
            lines.append(
                f"{common} {c['recovered']} of {c['of']} "
                f"({', '.join(map(str, c['rounds_recovered']))}) | {c['share']:.2f} ({seeds}) | "
                f"{c['psnr']:.1f} |{tail} {c['attack_s']:.2f} | {c['leak-s']:.2f} |"
            )
        else:
            lines.append(f"{common} refused: {c['refused']} | | |{tail} | {c['leak-s']:.2f} |")
    return "\n".join(lines)


def figure(cells: list[dict[str, Any]], images: int, path: Path) -> None:
    """Share recovered against clients per round: each seed a point, the mean a line."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    done = [c for c in cells if "share" in c]
    ax.plot([c["clients"] for c in done], [c["share"] for c in done], "-", color="C0")
    points = [(c["clients"], share) for c in done for share in c["seed_shares"]]
    ax.plot(
        [k for k, _ in points],
        [share for _, share in points],
        "o",
        color="C0",
        alpha=0.6,
        label="one seed (its rounds pooled); line: their mean",
    )
    for c in cells:
        if "share" not in c:  # no attack ran: no point, not a zero
            ax.axvline(c["clients"], color="C3", linestyle=":", linewidth=1)
            ax.annotate(
                f"refused: {c['summed']} >\n{BoxVertices.max_batch} images,\nno attack ran",
                (c["clients"], 0.5),
                textcoords="offset points",
                xytext=(-5, 0),
                ha="right",
                va="center",
                fontsize=8,
                color="C3",
            )
    ax.set_xscale("log", base=2)
    ticks = [c["clients"] for c in cells]
    ax.set_xticks(ticks, [f"{k}\n({k * images} img)" for k in ticks])
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("clients summed per round (images in the sum)")
    ax.set_ylabel("share of summed images recovered")
    ax.set_title(
        f"box-vertices on the secure aggregate: mlp-2nn FedSGD, {images} digits a client",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.subplots_adjust(bottom=0.2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches=None)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--images-per-client", type=int, default=4)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="folder for the runs and the CSV (a temp dir)")
    parser.add_argument("--figure", type=Path, default=FIGURE)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="aggregate-leakage-"))
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for clients in args.clients:
        for seed in args.seeds:
            rows += run_cell(clients, args.images_per_client, seed, args.rounds, out)
            done = rows[-1]
            print(
                f"clients {clients} seed {seed}: {done['status']}, "
                f"run {done['run-wall-seconds']:.1f} s",
                flush=True,
            )
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "aggregate_leakage.csv", index=False)
    cells = cell_rows(frame)
    figure(cells, args.images_per_client, args.figure)
    print(f"\n{markdown(cells)}")
    print(f"\nwall {time.perf_counter() - started:.0f} s; rows: {out / 'aggregate_leakage.csv'}")
    print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
