"""What a sweep writes in its folder, from its results and table.

Outputs in ``<out>``: ``results.csv`` (one row per run and attack),
``table.csv`` and ``table.md`` (mean and std over seeds per configuration),
``privacy-utility.png`` (accuracy against audit PSNR) and ``report.md``;
``sweep.json`` keeps what ``report.html`` needs again (``fedsim report``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fedsim.outputs.run_folder import REPORT_FILE as RUN_REPORT_FILE
from fedsim.outputs.run_folder import SUMMARY_FILE
from fedsim.sweeps.spec import CompareSpec
from fedsim.sweeps.table import table_markdown

RESULTS_FILE = "results.csv"
TABLE_CSV = "table.csv"
TABLE_MD = "table.md"
PLOT_FILE = "privacy-utility.png"
REPORT_FILE = "report.md"
SWEEP_FILE = "sweep.json"  # the spec's name, description and threshold, for fedsim report


def plot_privacy_utility(table: pd.DataFrame, title: str, path: Path) -> None:
    """Accuracy against audit PSNR, one point (mean, std bars) per configuration."""
    figure = Figure(figsize=(7, 5))
    ax = figure.subplots()
    points = table[np.isfinite(table["psnr-mean"]) & np.isfinite(table["accuracy-mean"])]
    markers = dict(zip(points["attack"].unique(), "osD^v<>", strict=False))
    for _, r in points.iterrows():
        label = r["configuration"] + (f" ({r['attack']})" if len(markers) > 1 else "")
        ax.errorbar(
            r["psnr-mean"],
            100 * r["accuracy-mean"],
            xerr=np.nan_to_num(r["psnr-std"]),
            yerr=np.nan_to_num(100 * r["accuracy-std"]),
            fmt=markers.get(r["attack"], "o"),
            capsize=3,
            label=label,
        )
        ax.annotate(
            label,
            (r["psnr-mean"], 100 * r["accuracy-mean"]),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    ax.set_xlabel("audit PSNR (dB, peak 1 on [0, 1]); lower = less leakage")
    ax.set_ylabel("final accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(points):
        ax.legend(fontsize=8, loc="best")
    figure.savefig(path, dpi=150, bbox_inches="tight")


def write_outputs(
    spec: CompareSpec,
    results: pd.DataFrame,
    table: pd.DataFrame,
    failed: Mapping[str, str],
    out: Path,
) -> None:
    """``results.csv``, ``table.csv``, ``table.md``, the plot and ``report.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    results.to_csv(out / RESULTS_FILE, index=False)
    table.to_csv(out / TABLE_CSV, index=False)
    markdown = (
        table_markdown(table, spec.success_psnr) if not table.empty else "(no finished runs)\n"
    )
    (out / TABLE_MD).write_text(markdown)
    if not table.empty:
        plot_privacy_utility(table, spec.name, out / PLOT_FILE)
    (out / REPORT_FILE).write_text(report_markdown(spec, results, markdown, failed))
    sweep = {"name": spec.name, "description": spec.description, "success-psnr": spec.success_psnr}
    (out / SWEEP_FILE).write_text(json.dumps({**sweep, "failed": dict(failed)}, indent=2) + "\n")
    write_sweep_report(out)


def _read_frame(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:  # a sweep without finished runs
        return pd.DataFrame()
    if "attack" in frame:  # unaudited runs have an empty attack, which pandas reads as nan
        # As strings first: a column of nan only is float, and filling a float column
        # with "" is an error in a coming pandas (Pandas4Warning now).
        frame["attack"] = frame["attack"].astype(object).fillna("")
    return frame


def write_sweep_report(out: Path) -> Path:
    """``report.html`` in a sweep folder, from the files :func:`write_outputs` wrote."""
    from fedsim.outputs.report import write_compare_report

    sweep = json.loads((out / SWEEP_FILE).read_text())
    table = _read_frame(out / TABLE_CSV)
    plot = out / PLOT_FILE
    return write_compare_report(
        out,
        sweep["name"],
        sweep["description"],
        table,
        _read_frame(out / RESULTS_FILE),
        plot.read_bytes() if plot.is_file() and not table.empty else None,
        sweep["failed"],
        sweep["success-psnr"],
        RUN_REPORT_FILE,
    )


def report_markdown(
    spec: CompareSpec, results: pd.DataFrame, table_md: str, failed: Mapping[str, str]
) -> str:
    """The sweep's report: setting, table, plot and the runs behind them."""
    base = spec.base if isinstance(spec.base, str) else "inline [base] table"
    threat = ", ".join(sorted(set(results.get("threat-model", pd.Series()).dropna()))) or "-"
    lines = [
        f"# {spec.name}",
        "",
        *([spec.description, ""] if spec.description else []),
        f"Base scenario: {base}. Seeds: {', '.join(map(str, spec.seeds))}. "
        f"Audit threat model: {threat}.",
        "",
        "## Privacy and utility",
        "",
        table_md,
        "Mean ± sample std over seeds. Accuracy is the final round's; the `from` column says "
        "which: `test-acc` is the global model on the held-out test set, `client-eval-acc` the "
        "personalised evaluation (each client's own model, for FedSplit/FedCG its private "
        "extractor with the shared classifier, on its local test split; mean over clients), "
        "used where a strategy has no global model. PSNR = 10 log10(1 / MSE) on pixels in "
        "[0, 1] (peak 1), SSIM with an 11-pixel Gaussian window, label accuracy the multiset "
        "overlap; each is the mean over every audited (round, victim) of a run. PSNR median, "
        "max and success (the share of attacks reaching the threshold) pool every attack of "
        "every seed. Lower PSNR and SSIM mean less leakage. epsilon is the accountant's after "
        "the final round (delta as set): record level for DP-SGD rows, user level for central "
        "DP rows; epsilon (canaries) the one-run audit's lower bound, its highest round. "
        "Labels TV, membership AUC and representatives SSIM: the other kinds' verdicts, "
        "the mean over a run's audited victims (lower TV, AUC nearer 0.5 and lower SSIM "
        "mean less leakage).",
        "",
        f"![privacy-utility plot]({PLOT_FILE})",
        "",
        "## Runs",
        "",
        "| configuration | seed | attack | accuracy | PSNR (dB) | seconds | run |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, r in results.iterrows():
        lines.append(
            f"| {r['configuration']} | {r['seed']} | {r['attack'] or '-'} | "
            f"{100 * r['accuracy']:.2f} | {r['psnr']:.2f} | {r['seconds']:.0f} | "
            f"[{r['run']}]({r['run']}/{SUMMARY_FILE}) |"
        )
    if failed:
        lines += ["", "## Failed runs (left out above; rerun to retry)", ""]
        lines += [f"- {path}: {error}" for path, error in failed.items()]
    return "\n".join(lines) + "\n"
