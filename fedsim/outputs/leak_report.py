"""The report's audit sections beyond the verdict curves: each kind of leak, compactly.

- membership: ROC curves on log axes (the low-FPR regime is what counts, Carlini
  et al. 2022), one panel per audited round, a line per client and analysis;
- labels: the estimated against the true class histogram of a round's clients
  (the strongest label analysis on each);
- class representatives: one table per round and analysis, a row per client, a
  column per class read, each cell the client's class-mean image above the
  representative;
- reconstructions: one table per round, a row per victim, a column for the
  truth and for each attack, the verdict's cell marked.

Everything is read back from the run folder (``leaks.csv``, ``membership.csv``,
``audit.csv``, ``audit/``), as the rest of the report is.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from fedsim.outputs.figures import data_uri, figure_png
from fedsim.outputs.run_folder import (
    AUDIT_IMAGES,
    MEMBERSHIP_FILE,
    audit_image_name,
    representative_image_name,
    truth_image_name,
)
from fedsim.outputs.words_report import word_table

MAX_PANELS = 3  # ROC panels: the first audited round, then evenly spaced to the last
MAX_CLIENTS = 4  # clients per round in the label figure


def _rounds_shown(rounds: list[int]) -> list[int]:
    if len(rounds) <= MAX_PANELS:
        return rounds
    picks = np.linspace(0, len(rounds) - 1, MAX_PANELS).round().astype(int)
    return [rounds[i] for i in sorted(set(picks))]


def roc_figure(membership: pd.DataFrame) -> Figure:
    """ROC curves per round on log-log axes, chance as the diagonal."""
    from sklearn.metrics import roc_curve

    rounds = _rounds_shown(sorted(set(membership["round"])))
    fig = Figure(figsize=(2.7 * len(rounds) + 0.6, 2.9))
    # Fixed margins and decade ticks only: tight_layout and log axes' minor ticks took
    # most of a run's extra report time (0.7 s of 1.2 s here), more than the analyses.
    fig.subplots_adjust(left=0.08, right=0.97, bottom=0.16, top=0.9, wspace=0.1)
    axes = np.atleast_1d(fig.subplots(1, len(rounds), sharey=True))
    for ax, server_round in zip(axes, rounds, strict=True):
        here = membership[membership["round"] == server_round]
        floor = 1.0
        for (client, analysis), group in here.groupby(["client", "analysis"], sort=True):
            fpr, tpr, _ = roc_curve(group["member"].astype(bool), group["score"].astype(float))
            negatives = int((~group["member"].astype(bool)).sum())
            floor = min(floor, 1.0 / max(1, negatives))
            ax.step(
                np.maximum(fpr, 1e-4),
                np.maximum(tpr, 1e-4),
                where="post",
                linewidth=1,
                label=f"{client} {analysis}",
            )
        ax.plot([floor, 1], [floor, 1], linestyle="--", color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_xlim(floor / 2, 1)
        ax.set_ylim(floor / 2, 1.05)
        ax.set_title(f"round {server_round}", fontsize=9)
        ax.set_xlabel("FPR", fontsize=8)
    axes[0].set_ylabel("TPR", fontsize=8)
    axes[-1].legend(fontsize=6, loc="lower right")
    return fig


def _counts(text: Any) -> np.ndarray:
    return (
        np.array([float(v) for v in str(text).split(";")])
        if isinstance(text, str)
        else np.array([])
    )


def labels_figure(leaks: pd.DataFrame) -> Figure | None:
    """Estimated (bars) against true (outline) examples per class in the last audited round,
    a panel per client (the first few), the client's strongest label analysis. One round:
    a grid of every round's panels took seconds to draw, more than the analyses' own cost."""
    labels = leaks[(leaks["kind"] == "labels") & leaks["label-truth"].notna()]
    if labels.empty:
        return None
    best = labels.loc[labels.groupby(["round", "client"])["label-tv"].idxmin()]
    rounds = [int(best["round"].max())]
    clients = sorted(set(best.loc[best["round"] == rounds[0], "client"]))[:MAX_CLIENTS]
    fig = Figure(figsize=(2.6 * len(clients), 2.0))
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.12, top=0.86, wspace=0.15)
    axes = np.atleast_2d(fig.subplots(len(rounds), len(clients), squeeze=False))
    for i, server_round in enumerate(rounds):
        for j, client in enumerate(clients):
            ax = axes[i, j]
            row = best[(best["round"] == server_round) & (best["client"] == client)]
            if row.empty:
                ax.set_axis_off()
                continue
            estimate, truth = (
                _counts(row["label-estimate"].iloc[0]),
                _counts(row["label-truth"].iloc[0]),
            )
            classes = np.arange(len(truth))
            edges = np.arange(len(truth) + 1) - 0.5  # one artist per histogram, not a bar each
            ax.stairs(estimate, edges, fill=True, color="#4c72b0", alpha=0.7, label="estimated")
            ax.stairs(truth, edges, color="black", linewidth=0.8, label="true")
            tv = float(row["label-tv"].iloc[0])
            ax.set_title(f"round {server_round}, client {client}: TV {tv:.2f}", fontsize=8)
            ax.set_xticks(classes)
            ax.tick_params(labelsize=6)
    axes[0, -1].legend(fontsize=6)
    return fig


def class_ids(value: Any) -> list[int]:
    """A ``;``-separated list of class ids as pandas read it back: a string, or a number
    where the CSV held one class (empty, NaN, where it held none)."""
    if isinstance(value, str):
        return [int(c) for c in value.split(";") if c]
    return [] if value is None or pd.isna(value) else [int(value)]


def representative_tables(run_dir: Path, leaks: pd.DataFrame) -> list[dict[str, Any]]:
    """Per round and analysis in pixels, a row per client and a column per class any
    client's representative was read for; a cell holds the client's class-mean image
    above the representative (blank where that client's update did not read the class)."""
    pictured = leaks[
        (leaks["kind"] == "representatives") & (leaks["representatives-space"] == "pixels")
    ]
    read: dict[tuple[int, str], dict[int, list[int]]] = {}
    for row in pictured.to_dict("records"):
        classes = class_ids(row.get("representatives-classes"))
        read.setdefault((int(row["round"]), str(row["analysis"])), {})[int(row["client"])] = classes
    tables = []
    for (server_round, analysis), clients in sorted(read.items()):
        columns = sorted({c for classes in clients.values() for c in classes})
        rows = []
        for client, classes in sorted(clients.items()):
            cells = []
            for cls in columns:
                name = representative_image_name(server_round, client, analysis, cls)
                path = run_dir / AUDIT_IMAGES / name
                shown = cls in classes and path.is_file()
                cells.append({"name": name, "uri": data_uri(path.read_bytes()) if shown else ""})
            rows.append({"client": str(client), "cells": cells})
        if columns:
            table = {"number": server_round, "analysis": analysis, "classes": columns}
            tables.append({**table, "rows": rows})
    return tables


def reconstruction_tables(run_dir: Path, audit: pd.DataFrame) -> list[dict[str, Any]]:
    """Per round, a row per victim: its truth, then each attack's reconstruction with its
    PSNR; ``best`` marks the verdict's cell (the highest PSNR)."""
    attacks = list(dict.fromkeys(audit["attack"]))
    folder = run_dir / AUDIT_IMAGES
    tables = []
    for server_round in sorted(set(audit["round"])):
        here = audit[audit["round"] == server_round]
        rows = []
        for client, group in here.groupby("client", sort=True):
            truth = folder / truth_image_name(int(server_round), int(client))
            psnr = group.set_index("attack")["psnr"].astype(float)
            # The verdict's cell: the best on what the server received, else the probe's.
            counterfactual = group.get("counterfactual", pd.Series(False, index=group.index))
            received = psnr[~counterfactual.astype(bool).to_numpy()]
            candidates = received if received.notna().any() else psnr
            best = candidates.idxmax() if candidates.notna().any() else None
            cells = []
            for attack in attacks:
                image = folder / audit_image_name(int(server_round), int(client), f"{attack}-only")
                value = float(psnr.get(attack, math.nan))
                cells.append(
                    {
                        "uri": data_uri(image.read_bytes()) if image.is_file() else "",
                        "text": "-" if math.isnan(value) else f"{value:.1f} dB",
                        "best": attack == best,
                    }
                )
            rows.append(
                {
                    "client": str(client),
                    "truth": data_uri(truth.read_bytes()) if truth.is_file() else "",
                    "cells": cells,
                }
            )
        tables.append({"number": int(server_round), "attacks": attacks, "rows": rows})
    return tables


def leak_context(run_dir: Path, leaks: pd.DataFrame) -> dict[str, Any]:
    """The report's leak figures, for the run page's template."""
    path = run_dir / MEMBERSHIP_FILE
    membership = pd.read_csv(path) if path.is_file() else pd.DataFrame()
    label_fig = labels_figure(leaks)
    return {
        "roc_curves": data_uri(figure_png(roc_figure(membership))) if not membership.empty else "",
        "label_histograms": data_uri(figure_png(label_fig)) if label_fig is not None else "",
        "representatives": representative_tables(run_dir, leaks),
        "word_sets": word_table(run_dir, leaks),
    }
