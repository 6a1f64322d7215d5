"""The audit's verdict: per victim the worst case over its attacks, per round with its uncertainty.

A round is only as private as its strongest attack allows. For each victim
(a client attacked in a round) the verdict takes, over every attack that ran
on it, the best PSNR, SSIM and label accuracy, each with the attack that
reached it: the auditor's worst case, chosen with the truth inside the
scorer. Beside it stands the attacker's own reading, the reconstruction it
would pick without the truth: the attack whose reconstruction best
reproduces the intercepted gradient (lowest ``attacker-residual``). A verdict
with any attack that did not converge is marked a *lower bound*.

Per round, the verdicts of the round's victims give the median PSNR with a
95 % percentile-bootstrap interval (seeded from the attacker's
``audit-bootstrap`` stream) and the share of victims the audit succeeded on
with a Wilson interval (:mod:`fedsim.core.metrics`). Everything here is a
function of ``audit.csv``: the verdict is recomputed, never stored state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fedsim.core import protocol
from fedsim.core.metrics import median_interval, success_interval
from fedsim.core.protocol import CONVERGED, LOWER_BOUND, AuditRecord, VerdictRecord
from fedsim.core.seeds import SeedStream, derive_seed

_col = AuditRecord.column


def _column(group: pd.DataFrame, field_name: str, dtype: type, missing: Any) -> np.ndarray:
    """A column of ``group`` as an array, ``missing`` throughout where it is absent."""
    name = _col(field_name)
    if name in group:
        return group[name].to_numpy(dtype=dtype)
    return np.full(len(group), missing, dtype=dtype)


def _best(values: np.ndarray, attacks: np.ndarray) -> tuple[float, str]:
    """The highest finite-or-inf value of a score column and the attack that reached it."""
    known = np.flatnonzero(~np.isnan(values))
    if not len(known):
        return math.nan, ""
    at = known[values[known].argmax()]
    return float(values[at]), str(attacks[at])


def victim_verdict(group: pd.DataFrame) -> VerdictRecord:
    """The verdict of one victim in one round from its attacks' ``audit.csv`` rows.

    On numpy arrays, not pandas rows: a run with ``victims = 0`` computes one per
    client and round."""
    attacks = group[_col("attack")].to_numpy()
    # Rows written before convergence and the attacker's residual were recorded (a run
    # resumed from an older checkpoint) count as not converged, with no residual.
    converged = _column(group, "converged", bool, False)
    psnr = _column(group, "psnr", float, math.nan)
    ssim = _column(group, "ssim", float, math.nan)
    label_acc = _column(group, "label_acc", float, math.nan)
    residual = _column(group, "attacker_residual", float, math.nan)
    if not np.isnan(residual).all():
        pick = int(np.where(np.isnan(residual), math.inf, residual).argmin())
        pick_attack, pick_psnr, pick_ssim = str(attacks[pick]), psnr[pick], ssim[pick]
        pick_residual = float(residual[pick])
    else:
        pick_attack, pick_psnr, pick_ssim, pick_residual = "", math.nan, math.nan, math.nan
    first = group.iloc[0]
    best_psnr, psnr_attack = _best(psnr, attacks)
    best_ssim, ssim_attack = _best(ssim, attacks)
    best_label_acc, label_attack = _best(label_acc, attacks)
    return VerdictRecord(
        round=int(first[_col("round")]),
        client=int(first[_col("client")]),
        batch_size=int(first[_col("batch_size")]),
        attacks=len(group),
        attacks_converged=int(converged.sum()),
        bound=CONVERGED if bool(converged.all()) else LOWER_BOUND,
        psnr=best_psnr,
        psnr_attack=psnr_attack,
        ssim=best_ssim,
        ssim_attack=ssim_attack,
        label_acc=best_label_acc,
        label_acc_attack=label_attack,
        pick_attack=pick_attack,
        pick_psnr=float(pick_psnr),
        pick_ssim=float(pick_ssim),
        pick_residual=pick_residual,
    )


def victim_verdicts(audit: pd.DataFrame) -> pd.DataFrame:
    """One :class:`~fedsim.core.protocol.VerdictRecord` row per (round, client) of ``audit``."""
    if audit.empty:
        return pd.DataFrame(columns=[protocol.kebab(n) for n in VerdictRecord.__annotations__])
    rows = [
        victim_verdict(group).to_row()
        for _, group in audit.groupby([_col("round"), _col("client")], sort=True)
    ]
    return pd.DataFrame(rows)


def round_verdict(
    verdicts: pd.DataFrame, server_round: int, audit_seed: int, success_psnr: float
) -> dict[str, float]:
    """The round's verdict from its victims' rows: the ``metrics.csv`` audit columns."""
    rows = verdicts[verdicts["round"] == server_round]
    psnr = rows["psnr"].astype(float).to_numpy()
    seed = derive_seed(SeedStream.AUDIT_BOOTSTRAP, audit_seed, server_round)
    median = median_interval(psnr, seed)
    scored = psnr[~np.isnan(psnr)]
    success = success_interval(int((scored >= success_psnr).sum()), len(scored))
    return {
        protocol.AUDIT_PSNR: median.value,
        protocol.AUDIT_PSNR_LOW: median.low,
        protocol.AUDIT_PSNR_HIGH: median.high,
        protocol.AUDIT_SSIM: _median(rows["ssim"]),
        protocol.AUDIT_LABEL_ACC: _median(rows["label-acc"]),
        protocol.AUDIT_SUCCESS: success.value,
        protocol.AUDIT_SUCCESS_LOW: success.low,
        protocol.AUDIT_SUCCESS_HIGH: success.high,
        protocol.AUDIT_VICTIMS: float(len(rows)),
        protocol.AUDIT_LOWER_BOUND: float((rows["bound"] != CONVERGED).any()),
    }


def _median(values: pd.Series) -> float:
    known = values.astype(float).dropna()
    return float(known.median()) if len(known) else math.nan


def round_verdicts(
    verdicts: pd.DataFrame, audit_seed: int, success_psnr: float
) -> list[dict[str, Any]]:
    """:func:`round_verdict` for every audited round, with its round and strongest attacks."""
    out = []
    for server_round in sorted(set(verdicts["round"])):
        rows = verdicts[verdicts["round"] == server_round]
        out.append(
            {
                protocol.ROUND: int(server_round),
                **round_verdict(verdicts, int(server_round), audit_seed, success_psnr),
                "strongest": strongest_attacks(rows["psnr-attack"]),
            }
        )
    return out


def strongest_attacks(attacks: Sequence[str] | pd.Series) -> str:
    """Which attacks gave the verdicts, most often first: ``ig 3/4, dlg 1/4``."""
    names = [a for a in attacks if isinstance(a, str) and a]
    if not names:
        return "-"
    counts = pd.Series(names).value_counts(sort=True)
    return ", ".join(f"{name} {count}/{len(names)}" for name, count in counts.items())


def verdict_line(server_round: int, verdict: dict[str, float], verdicts: pd.DataFrame) -> str:
    """The round's verdict in one terminal line."""
    psnr = verdict[protocol.AUDIT_PSNR]
    low, high = verdict[protocol.AUDIT_PSNR_LOW], verdict[protocol.AUDIT_PSNR_HIGH]
    interval = "" if math.isnan(low) else f" [{low:.1f}, {high:.1f}]"
    bound = LOWER_BOUND if verdict[protocol.AUDIT_LOWER_BOUND] else CONVERGED
    victims = int(verdict[protocol.AUDIT_VICTIMS])
    strongest = strongest_attacks(verdicts[verdicts["round"] == server_round]["psnr-attack"])
    return (
        f"  audit round {server_round} verdict: PSNR {psnr:.2f} dB{interval} (median over "
        f"{victims} victim{'s' if victims != 1 else ''}; {bound}), strongest: {strongest}"
    )
