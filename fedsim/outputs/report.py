"""``report.html``: one self-contained page per run and per sweep.

A run's page: overview, accuracy and loss curves (every further numeric
per-round metric gets its own panel), the audit's verdict per round (the
worst case over its attacks, with its intervals as bands) and per victim,
then the single attacks' PSNR / SSIM / label accuracy per round, the audit
table, the labelled reconstruction grids per audited round, the resource
plan (when the run directory has one) and the resolved scenario. A sweep's
page: the privacy-utility plot, the table (mean, median, max PSNR and success
share) and links to its runs' pages. Plots come
from matplotlib, the page from the Jinja2 templates of
:mod:`fedsim.outputs.report_templates`, and every image is embedded as a
``data:`` URI, so the file can be mailed.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedsim import fedsim_version
from fedsim.core import protocol
from fedsim.core.metrics import EXACT_PSNR
from fedsim.core.protocol import AuditRecord
from fedsim.outputs.figures import data_uri, figure_png
from fedsim.outputs.leak_report import leak_context, reconstruction_tables
from fedsim.outputs.report_templates import TEMPLATES
from fedsim.outputs.run_folder import (
    METRICS_FILE,
    REPORT_FILE,
    SCENARIO_FILE,
    read_audit,
    read_departures,
    read_wall_seconds,
)
from fedsim.outputs.sentences_report import sentence_table, sentences_round_table, text_rows
from fedsim.outputs.tables import (
    DEFAULT_SUCCESS_PSNR,
    VERDICT_VICTIM_COLUMNS,
    Column,
    attack_summary_table,
    audit_seed,
    comparison_table,
    duration,
    formatted_rows,
    leak_verdict_table,
    round_verdict_table,
    sweep_runs_table,
)
from fedsim.outputs.verdict import victim_verdicts

# Files a resource plan may be written to (issue 13's runner); shown when present.
PLAN_PATTERNS = ("plan.*", "resources.*", "resource-plan.*")
# Per-round columns that are bookkeeping, not curves.
NOT_CURVES = {
    protocol.ROUND,
    protocol.CLIENTS_SAMPLED,
    protocol.CLIENTS_TRAINED,
    protocol.FAILURES,
    protocol.SECONDS,
    # The audit's verdict has its own section.
    *protocol.AUDIT_COLUMNS,
}
ACCURACY = (protocol.TEST_ACC, protocol.CLIENT_EVAL_ACC)
EPSILON = {
    protocol.DP_EPSILON: "record level, DP-SGD's accountant (Opacus)",
    protocol.CENTRAL_DP_EPSILON: "user level, central DP's accountant (Flower)",
    protocol.AUDIT_EPSILON_EMPIRICAL: "record level, lower bound from the audit's canaries, 95 %",
    protocol.AUDIT_EPSILON_EMPIRICAL_FDP: (
        "record level, f-DP lower bound from the same canaries (mu-GDP), 95 %"
    ),
    protocol.CENTRAL_DP_EPSILON_EMPIRICAL: (
        "user level, estimate from the audit's canary clients (Andrew et al.), not a bound"
    ),
}
LOSS = (protocol.TRAIN_LOSS, protocol.TEST_LOSS, protocol.CLIENT_EVAL_LOSS)
AUDIT_SCORES = (("psnr", "PSNR (dB)"), ("ssim", "SSIM"), ("label_acc", "label accuracy"))


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.DictLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )


def _render(template: str, path: Path, **context: Any) -> Path:
    page = _environment().get_template(template).render(version=fedsim_version(), **context)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(page)
    tmp.replace(path)
    return path


EXPOSURE = "exposure-"
"""Metric columns of canaries' exposure, drawn in one panel."""


def _curve_columns(metrics: pd.DataFrame) -> list[str]:
    """Numeric per-round columns with at least one finite value, in file order."""
    return [
        c
        for c in metrics.columns
        if c not in NOT_CURVES
        and pd.api.types.is_numeric_dtype(metrics[c])
        and np.isfinite(metrics[c].astype(float)).any()
    ]


def _round_axis(ax: Any) -> None:
    ax.set_xlabel("round", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def curves_figure(metrics: pd.DataFrame) -> Figure:
    """Accuracy and loss panels, then one panel per further metric (strategy-specific ones)."""
    columns = _curve_columns(metrics)
    groups = [("accuracy", [c for c in ACCURACY if c in columns])]
    groups += [("loss", [c for c in LOSS if c in columns])]
    exposure = [c for c in columns if c.startswith(EXPOSURE)]  # [memorisation]'s canaries
    groups += [("canaries' exposure (bits)", exposure)]
    shown = {*ACCURACY, *LOSS, *exposure}
    groups += [(c, [c]) for c in columns if c not in shown]
    groups = [(title, cols) for title, cols in groups if cols]
    panels = max(1, len(groups))
    per_row = min(3, panels)
    rows = math.ceil(panels / per_row)
    fig = Figure(figsize=(4.2 * per_row, 3.0 * rows))
    axes = list(fig.subplots(rows, per_row, squeeze=False).flat)
    for ax, (title, cols) in zip(axes, groups, strict=False):
        for col in cols:
            ax.plot(metrics[protocol.ROUND], metrics[col], marker="o", markersize=3, label=col)
        ax.set_title(title, fontsize=9)
        _round_axis(ax)
    for ax in axes[len(groups) :]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def _verdict_band(ax: Any, rounds: pd.DataFrame, key: str, low: str, high: str, label: str) -> None:
    """One verdict curve with its interval band; hollow markers for lower bounds."""
    x = rounds[protocol.ROUND].to_numpy()
    lower = rounds[protocol.AUDIT_LOWER_BOUND].to_numpy() > 0
    y = rounds[key].astype(float).to_numpy()
    band = (rounds[low].astype(float), rounds[high].astype(float))
    ax.fill_between(x, *band, alpha=0.25, color="C3", label="95 % interval")
    ax.plot(x, y, color="C3", linewidth=2, label=f"verdict ({label})")
    ax.scatter(x[~lower], y[~lower], color="C3", zorder=3)
    ax.scatter(
        x[lower],
        y[lower],
        facecolors="white",
        edgecolors="C3",
        zorder=3,
        label="lower bound" if lower.any() else None,
    )


def verdict_figure(rounds: pd.DataFrame, audit: pd.DataFrame, success_psnr: float) -> Figure:
    """The verdict per round: median PSNR over victims with its bootstrap band (the
    single attacks' medians thin beneath it), and the success share with its Wilson band.
    A hollow marker is a lower bound (an attack in it did not converge)."""
    col = AuditRecord.column
    fig = Figure(figsize=(12.6, 3.2))
    psnr_ax, success_ax = fig.subplots(1, 2)
    p = protocol
    _verdict_band(psnr_ax, rounds, p.AUDIT_PSNR, p.AUDIT_PSNR_LOW, p.AUDIT_PSNR_HIGH, "median PSNR")
    success = (p.AUDIT_SUCCESS, p.AUDIT_SUCCESS_LOW, p.AUDIT_SUCCESS_HIGH)
    _verdict_band(success_ax, rounds, *success, "success share")
    for attack, group in audit.groupby(col("attack"), sort=False):
        values = group[col("psnr")].astype(float).clip(upper=EXACT_PSNR)
        per_round = values.groupby(group[col("round")]).median()
        psnr_ax.plot(
            per_round.index,
            per_round.to_numpy(),
            linewidth=0.8,
            alpha=0.7,
            marker=".",
            label=attack,
        )
    psnr_ax.axhline(success_psnr, linestyle="--", color="grey", linewidth=1)
    psnr_ax.set_title("verdict PSNR (dB): best attack per victim, median over victims", fontsize=9)
    success_ax.set_ylim(-0.02, 1.02)
    success_ax.set_title(f"share of victims with verdict PSNR >= {success_psnr:g} dB", fontsize=9)
    for ax in (psnr_ax, success_ax):
        _round_axis(ax)
    fig.tight_layout()
    return fig


def audit_curves_figure(audit: pd.DataFrame, success_psnr: float) -> Figure:
    """PSNR, SSIM and label accuracy per round (mean over victims), a line per attack."""
    col = AuditRecord.column
    fig = Figure(figsize=(12.6, 3.0))
    axes = fig.subplots(1, len(AUDIT_SCORES))
    for ax, (field_name, title) in zip(axes, AUDIT_SCORES, strict=True):
        for attack, group in audit.groupby(col("attack"), sort=False):
            values = group[col(field_name)].astype(float).replace([np.inf, -np.inf], np.nan)
            per_round = values.groupby(group[col("round")]).mean()
            ax.plot(per_round.index, per_round.to_numpy(), marker="o", markersize=3, label=attack)
        if field_name == "psnr":
            ax.axhline(success_psnr, linestyle="--", color="grey", linewidth=1)
        ax.set_title(title, fontsize=9)
        _round_axis(ax)
    fig.tight_layout()
    return fig


def _plan_files(run_dir: Path) -> list[dict[str, str]]:
    found = sorted({p for pattern in PLAN_PATTERNS for p in run_dir.glob(pattern) if p.is_file()})
    return [{"name": p.name, "text": p.read_text(errors="replace")} for p in found]


def _overview(run_dir: Path, metrics: pd.DataFrame) -> list[str]:
    lines = [f"run directory: {run_dir.resolve()}", f"rounds finished: {len(metrics)}"]
    wall = read_wall_seconds(run_dir)
    if math.isfinite(wall):
        lines.append(f"wall time: {duration(wall)} ({wall:.1f}s)")
    else:
        lines.append("wall time: not recorded (the run has not finished)")
    lines += [f"departs from the authors' settings: {line}" for line in read_departures(run_dir)]
    if len(metrics):
        last = metrics.iloc[-1]
        for key in ACCURACY:
            if key in metrics and math.isfinite(float(last[key])):
                lines.append(f"final {key}: {float(last[key]):.4f}")
        for key, meaning in EPSILON.items():
            if key in metrics and math.isfinite(float(last[key])):
                value = f"{float(last[key]):.3g}"
                if f"{key}-low" in metrics:  # an estimate's 95 % interval
                    value += f" [{float(last[f'{key}-low']):.3g}, {float(last[f'{key}-high']):.3g}]"
                lines.append(f"{key} after the last round: {value} ({meaning})")
    return lines


AUDIT_ROW_FIELDS = (
    *("round", "client", "attack", "threat_model", "batch_size"),
    *("psnr", "ssim", "label_acc", "final_objective", "steps_taken", "converged", "seconds"),
)


def write_run_report(run_dir: Path, success_psnr: float = DEFAULT_SUCCESS_PSNR) -> Path:
    """Write ``RUN_DIR/report.html`` from what the run directory holds; return its path."""
    run_dir = Path(run_dir)
    metrics_file = run_dir / METRICS_FILE
    metrics = pd.read_csv(metrics_file) if metrics_file.is_file() else pd.DataFrame()
    scenario_file = run_dir / SCENARIO_FILE
    scenario = scenario_file.read_text() if scenario_file.is_file() else "(no scenario.toml)"
    name = tomllib.loads(scenario).get("name", run_dir.name) if scenario_file.is_file() else ""
    audit, leaks = read_audit(run_dir)
    # Derived from audit.csv and leaks.csv, as verdict.csv is.
    verdicts = victim_verdicts(audit, leaks)
    text = text_rows(audit)
    audit = audit.drop(index=text.index)  # the rest: image attacks, scored in pixels
    context: dict[str, Any] = {
        "title": f"fedsim run: {name}",
        "subtitle": str(run_dir),
        "overview": _overview(run_dir, metrics),
        "curves": data_uri(figure_png(curves_figure(metrics))) if len(metrics) else "",
        "reconstructed": not audit.empty,
        "leaks_audited": not leaks.empty,
        "plan": _plan_files(run_dir),
        "scenario": scenario,
        "success_psnr": f"{success_psnr:g}",
    }
    context.update(_sentences_context(run_dir, text, verdicts))
    if not leaks.empty:
        table = leak_verdict_table(verdicts, audit_seed(run_dir)).table
        context.update(
            leak_rounds=table.rows, leak_round_columns=table.columns, **leak_context(run_dir, leaks)
        )
    attacked = verdicts[verdicts["attacks"] > 0] if not verdicts.empty else verdicts
    if "sentences-exact" in attacked:
        attacked = attacked[attacked["sentences-exact"].isna()]
    context["audited"] = not attacked.empty  # a verdict on what the server received
    if not attacked.empty:
        rounds = round_verdict_table(attacked, audit_seed(run_dir), success_psnr)
        context.update(
            verdict_curves=data_uri(
                figure_png(verdict_figure(pd.DataFrame(rounds.raw), audit, success_psnr))
            ),
            verdict_rounds=rounds.table.rows,
            verdict_round_columns=rounds.table.columns,
            verdict_victims=formatted_rows(attacked.to_dict("records"), {}),
            verdict_victim_columns=VERDICT_VICTIM_COLUMNS,
        )
    if not audit.empty:  # reconstructions, the counterfactual probe's included
        summary = attack_summary_table(audit, success_psnr)
        columns = [Column(AuditRecord.column(f), AuditRecord.column(f)) for f in AUDIT_ROW_FIELDS]
        context.update(
            audit_curves=data_uri(figure_png(audit_curves_figure(audit, success_psnr))),
            audit_summary=summary.rows,
            audit_summary_columns=summary.columns,
            audit_rows=formatted_rows(audit.to_dict("records"), {}),
            audit_columns=columns,
            reconstruction_tables=reconstruction_tables(run_dir, audit),
        )
    return _render("run.html.j2", run_dir / REPORT_FILE, **context)


def _sentences_context(run_dir: Path, text: pd.DataFrame, verdicts: pd.DataFrame) -> dict[str, Any]:
    """The report's text reconstruction tables (nothing without text attacks)."""
    rounds = sentences_round_table(verdicts, audit_seed(run_dir))
    sentences = sentence_table(run_dir, text)
    if rounds is None or sentences is None:
        return {}
    return {"sentences_rounds": rounds, "sentence_sets": sentences}


def write_compare_report(
    out: Path,
    title: str,
    description: str,
    table: pd.DataFrame,
    results: pd.DataFrame,
    plot_png: bytes | None,
    failed: Mapping[str, str],
    success_psnr: float,
    run_report: str,
) -> Path:
    """Write ``OUT/report.html`` for a sweep; runs link to ``<run>/<run_report>``."""
    summary = comparison_table(table, success_psnr)
    runs = sweep_runs_table(results, run_report)
    return _render(
        "compare.html.j2",
        out / REPORT_FILE,
        title=f"fedsim compare: {title}",
        subtitle=description,
        plot=data_uri(plot_png) if plot_png else "",
        table_rows=summary.rows,
        table_columns=summary.columns,
        run_rows=runs.rows,
        run_columns=runs.columns,
        failed=dict(failed),
        success_psnr=f"{success_psnr:g}",
    )
