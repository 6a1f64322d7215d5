"""The comparison table: each finished run's scores, then their summary over seeds.

Accuracy is the final round's: ``test-acc`` (the global model on the held-out
test set) where the run has one, else ``client-eval-acc`` (personalised: each
client's model on its local test split, mean over clients; FedSplit, FedCG and
local have no global model). Audit columns are means over every audited
(round, victim) of the run, non-finite PSNRs left out as the auditor does. A
mean hides a split (3.3 and 54.7 dB average to 29 dB), so the table also gives
the median and max PSNR and the share of attacks at or above ``success-psnr``,
over every attack of every seed. A run that ran more than one attack (the
``"auto"`` portfolio) also gets a ``verdict`` row, first: the same statistics
over its victims' verdicts (per victim the best of its attacks, ``verdict.csv``).
``seconds`` is each run's true wall time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedsim.core import protocol
from fedsim.core.protocol import AuditRecord
from fedsim.outputs.run_folder import (
    AUDIT_FILE,
    CLIENTS_FILE,
    METRICS_FILE,
    VERDICT_FILE,
    read_wall_seconds,
)
from fedsim.outputs.tables import (
    DEFAULT_SUCCESS_PSNR,
    comparison_table,
    leakage_stats,
)
from fedsim.outputs.verdict import victim_verdicts
from fedsim.sweeps.spec import Configuration

LEAK_SCORES = ("label-tv", "membership-auc", "representatives-ssim")
"""The other kinds' verdicts (``verdict.csv``), each a run's mean over its audited victims."""
EPSILONS = ("epsilon", "epsilon-empirical", "epsilon-empirical-fdp")
SCORES = ("accuracy", "psnr", "ssim", "label-acc", *LEAK_SCORES, *EPSILONS)


def accountant_epsilon(last: pd.Series) -> float:
    """The accountant's epsilon after the last round: DP-SGD's (record level), else central
    DP's (user level), else NaN."""
    for key in (protocol.DP_EPSILON, protocol.CENTRAL_DP_EPSILON):
        value = float(last.get(key, math.nan))
        if math.isfinite(value):
            return value
    return math.nan


def empirical_epsilon(metrics: pd.DataFrame) -> float:
    """The one-run audit's lower bound from the canaries (its highest round), else the
    canary clients' user-level estimate after the last round, else NaN."""
    column = metrics.get(protocol.AUDIT_EPSILON_EMPIRICAL)
    if column is not None and not column.isna().all():
        return float(column.max())
    estimates = metrics.get(protocol.CENTRAL_DP_EPSILON_EMPIRICAL)
    if estimates is not None and not estimates.isna().all():
        return float(estimates.dropna().iloc[-1])
    return math.nan


def fdp_epsilon(metrics: pd.DataFrame) -> float:
    """The f-DP one-run bound from the canaries (its highest round), else NaN."""
    column = metrics.get(protocol.AUDIT_EPSILON_EMPIRICAL_FDP)
    return float(column.max()) if column is not None and not column.isna().all() else math.nan


def leak_verdicts(verdict_file: Path) -> dict[str, float]:
    """A run's labels, membership and representatives verdicts: the mean over its audited
    victims of each (NaN where the kind was not analysed or the run not audited)."""
    verdicts = pd.read_csv(verdict_file) if verdict_file.is_file() else pd.DataFrame()
    return {
        score: _finite_mean(verdicts[score]) if score in verdicts else math.nan
        for score in LEAK_SCORES
    }


def _finite_mean(values: pd.Series) -> float:
    finite = values[np.isfinite(values.astype(float))]
    return float(finite.mean()) if len(finite) else math.nan


BEST_VAL = "best-val"
"""``accuracy = "best-val"``: the FedCG code's score (:func:`best_validation_accuracy`)."""


def best_validation_accuracy(clients: pd.DataFrame) -> float:
    """The FedCG code's score from a run's ``clients.csv``: each client's ``local-test-acc``
    (its model right after local training) in its first round of highest
    ``local-val-acc``, averaged over clients; NaN when no client reported both."""
    columns = {protocol.LOCAL_VAL_ACC, protocol.LOCAL_TEST_ACC, protocol.PARTITION_ID}
    if not columns <= set(clients.columns):
        return math.nan
    train = clients[clients[protocol.PHASE] == "train"].dropna(subset=sorted(columns))
    best = [
        float(rows[protocol.LOCAL_TEST_ACC].iloc[int(rows[protocol.LOCAL_VAL_ACC].argmax())])
        for _, rows in train.sort_values(protocol.ROUND).groupby(protocol.PARTITION_ID)
    ]
    return float(np.mean(best)) if best else math.nan


def run_results(
    config: Configuration,
    run_dir: Path,
    accuracy: str,
    success_psnr: float = DEFAULT_SUCCESS_PSNR,
) -> list[dict[str, Any]]:
    """One row per attack (one row if not audited) of a finished run."""
    metrics = pd.read_csv(run_dir / METRICS_FILE)
    last = metrics.iloc[-1]
    source = accuracy
    if accuracy == "auto":
        source = (
            protocol.TEST_ACC if math.isfinite(float(last.get(protocol.TEST_ACC, math.nan))) else ""
        )
        source = source or protocol.CLIENT_EVAL_ACC
    if source == BEST_VAL:
        score = best_validation_accuracy(pd.read_csv(run_dir / CLIENTS_FILE))
    else:
        score = float(last.get(source, math.nan))
    row: dict[str, Any] = {
        "configuration": config.label,
        "strategy": config.strategy,
        "defence": config.defence,
        "seed": config.seed,
        "accuracy": score,
        "accuracy-from": source,
        "epsilon": accountant_epsilon(last),
        "epsilon-empirical": empirical_epsilon(metrics),
        "epsilon-empirical-fdp": fdp_epsilon(metrics),
        **leak_verdicts(run_dir / VERDICT_FILE),
        "rounds": len(metrics),
        "seconds": read_wall_seconds(run_dir),
        "run": str(run_dir.relative_to(run_dir.parents[2])),  # relative to the sweep
    }
    audit_file = run_dir / AUDIT_FILE
    if not audit_file.is_file():
        unaudited = {"psnr": math.nan, "ssim": math.nan, "label-acc": math.nan}
        return [{**row, "attack": "", **unaudited, **leakage_stats([], success_psnr)}]
    audit = pd.read_csv(audit_file)
    col = AuditRecord.column
    threat = "/".join(sorted(set(audit[col("threat_model")])))
    scored = [
        (attack, group[col("psnr")], group[col("ssim")], group[col("label_acc")])
        for attack, group in audit.groupby(col("attack"), sort=False)
    ]
    verdicts = verdict_rows(audit)
    if verdicts is not None:  # a portfolio ran: its worst case per victim comes first
        scored.insert(0, (VERDICT, verdicts["psnr"], verdicts["ssim"], verdicts["label-acc"]))
    return [
        {
            **row,
            "attack": attack,
            "threat-model": threat,
            "audited": len(psnr),
            "psnr": _finite_mean(psnr),
            "ssim": float(ssim.mean()),
            "label-acc": float(labels.mean()),
            **leakage_stats(psnr, success_psnr),
        }
        for attack, psnr, ssim, labels in scored
    ]


VERDICT = "verdict"
"""The ``attack`` of a run's verdict rows: per victim the best of its attacks."""


def verdict_rows(audit: pd.DataFrame) -> pd.DataFrame | None:
    """A run's verdicts (as in its ``verdict.csv``) when more than one attack ran; else
    ``None``: the verdict is that attack."""
    several = audit[AuditRecord.column("attack")].nunique() > 1
    return victim_verdicts(audit) if several else None


def collect_results(
    configs: list[Configuration],
    runs: Path,
    accuracy: str,
    success_psnr: float = DEFAULT_SUCCESS_PSNR,
) -> pd.DataFrame:
    """Every finished run's rows, in spec order."""
    rows = [r for c in configs for r in run_results(c, runs / c.path, accuracy, success_psnr)]
    return pd.DataFrame(rows)


def collect_attacks(configs: list[Configuration], runs: Path) -> pd.DataFrame:
    """Every audited attack of every finished run: configuration, seed, attack, PSNR."""
    col = AuditRecord.column
    frames = []
    for c in configs:
        if not (runs / c.path / AUDIT_FILE).is_file():
            continue
        audit = pd.read_csv(runs / c.path / AUDIT_FILE)
        verdicts = verdict_rows(audit)
        audit = audit[[col("attack"), col("psnr")]]
        if verdicts is not None:
            audit = pd.concat([verdicts[["psnr"]].assign(attack=VERDICT), audit])
        frames.append(audit.assign(configuration=c.label, seed=c.seed))
    columns = ["attack", "psnr", "configuration", "seed"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def summarise(
    results: pd.DataFrame,
    attacks: pd.DataFrame | None = None,
    success_psnr: float = DEFAULT_SUCCESS_PSNR,
) -> pd.DataFrame:
    """Mean and (sample) std over seeds of each score, per configuration and attack;
    with ``attacks`` (:func:`collect_attacks`) also the median and max PSNR and the
    success share over every attack of every seed."""
    if results.empty:
        return pd.DataFrame()
    rows = []
    for (label, attack), group in results.groupby(["configuration", "attack"], sort=False):
        row: dict[str, Any] = {
            "configuration": label,
            "strategy": group["strategy"].iloc[0],
            "defence": group["defence"].iloc[0],
            "attack": attack,
            "accuracy-from": "/".join(sorted(set(group["accuracy-from"]))),
            "seeds": len(group),
        }
        for score in SCORES:  # a sweep recorded before a score existed lacks its column
            values = group.get(score, pd.Series(math.nan, index=group.index)).astype(float)
            row[f"{score}-mean"] = _finite_mean(values)
            finite = values[np.isfinite(values)]
            row[f"{score}-std"] = float(finite.std(ddof=1)) if len(finite) > 1 else math.nan
        if attacks is not None:
            pooled = attacks[(attacks["configuration"] == label) & (attacks["attack"] == attack)]
            stats = leakage_stats(pooled["psnr"], success_psnr)
            row["attacks"] = len(pooled)
            row.update({k: stats[k] for k in ("psnr-median", "psnr-max", "success-rate")})
        rows.append(row)
    return pd.DataFrame(rows)


def table_markdown(table: pd.DataFrame, success_psnr: float = DEFAULT_SUCCESS_PSNR) -> str:
    """The summary table as markdown (:func:`fedsim.outputs.tables.comparison_table`)."""
    return comparison_table(table, success_psnr).markdown() + "\n"
