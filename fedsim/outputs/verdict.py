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
PRIOR = "prior"  # the label verdict's name for the data-free guess that no analysis beat


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


def victim_verdict(group: pd.DataFrame, leaks: pd.DataFrame | None = None) -> VerdictRecord:
    """The verdict of one victim in one round from its attacks' ``audit.csv`` rows and its
    leak analyses' ``leaks.csv`` rows (either may be empty, not both).

    On numpy arrays, not pandas rows: a run with ``victims = 0`` computes one per
    client and round."""
    leaks = leaks if leaks is not None else pd.DataFrame()
    first = group.iloc[0] if len(group) else leaks.iloc[0]
    counterfactual = _column(group, "counterfactual", bool, False)
    probe, group = group[counterfactual], group[~counterfactual]
    attacks = group[_col("attack")].to_numpy() if len(group) else np.array([], dtype=object)
    # Rows written before convergence and the attacker's residual were recorded (a run
    # resumed from an older checkpoint) count as not converged, with no residual.
    converged = _column(group, "converged", bool, False)
    psnr = _column(group, "psnr", float, math.nan)
    ssim = _column(group, "ssim", float, math.nan)
    label_acc = _column(group, "label_acc", float, math.nan)
    residual = _column(group, "attacker_residual", float, math.nan)
    if len(residual) and not np.isnan(residual).all():
        pick = int(np.where(np.isnan(residual), math.inf, residual).argmin())
        pick_attack, pick_psnr, pick_ssim = str(attacks[pick]), psnr[pick], ssim[pick]
        pick_residual = float(residual[pick])
    else:
        pick_attack, pick_psnr, pick_ssim, pick_residual = "", math.nan, math.nan, math.nan
    best_psnr, psnr_attack = _best(psnr, attacks)
    best_ssim, ssim_attack = _best(ssim, attacks)
    best_label_acc, label_attack = _best(label_acc, attacks)
    return VerdictRecord(
        round=int(first["round"]),
        client=int(first["client"]),
        batch_size=_examples(group, leaks, probe),
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
        **_leak_verdict(leaks),
        **_counterfactual_verdict(probe),
        **_sentences_verdict(group, attacks),
    )


def _sentences_verdict(group: pd.DataFrame, attacks: np.ndarray) -> dict[str, Any]:
    """The victim's text reconstruction: its best exact-sequence rate (with the attack),
    token accuracy and ROUGE-1 over its text attacks (none: no fields)."""
    exact, attack = _best(_column(group, "exact_rate", float, math.nan), attacks)
    if not attack:
        return {}
    token_acc, _ = _best(_column(group, "token_acc", float, math.nan), attacks)
    rouge1, _ = _best(_column(group, "rouge1", float, math.nan), attacks)
    return {
        "sentences_exact": exact,
        "sentences_token_acc": token_acc,
        "sentences_rouge1": rouge1,
        "sentences_attack": attack,
    }


def _examples(group: pd.DataFrame, leaks: pd.DataFrame, probe: pd.DataFrame) -> int:
    """What the victim's upload was computed on: the attacked update's batch, else the
    analysed update's examples, else the counterfactual probe's batch."""
    if len(group):
        return int(group[_col("batch_size")].iloc[0])
    if len(leaks):
        return int(leaks["examples"].iloc[0])
    return int(probe[_col("batch_size")].iloc[0])


def _counterfactual_verdict(probe: pd.DataFrame) -> dict[str, Any]:
    """The counterfactual probe's best reconstruction of this victim, kept apart."""
    if probe.empty:
        return {}
    attacks = probe[_col("attack")].to_numpy()
    psnr, attack = _best(_column(probe, "psnr", float, math.nan), attacks)
    ssim, _ = _best(_column(probe, "ssim", float, math.nan), attacks)
    return {
        "counterfactual_psnr": psnr,
        "counterfactual_ssim": ssim,
        "counterfactual_attack": attack,
    }


def _leak_verdict(leaks: pd.DataFrame) -> dict[str, Any]:
    """The strongest analysis of each kind on one victim (chosen with the truth, as the
    reconstruction verdict is): the lowest label TV, the highest membership AUC, the
    highest representatives' SSIM (or feature cosine where no image was inverted)."""
    if leaks.empty:
        return {}
    names = leaks["analysis"].to_numpy()
    tv = leaks["label-tv"].to_numpy(dtype=float)
    out: dict[str, Any] = {}
    if not np.isnan(tv).all():
        out.update(_label_verdict(leaks, tv, names))
    auc = leaks["membership-auc"].to_numpy(dtype=float)
    if not np.isnan(auc).all():
        at = int(np.nanargmax(auc))
        row = leaks.iloc[at]
        out.update(
            membership_auc=float(auc[at]),
            membership_auc_low=float(row["membership-auc-low"]),
            membership_auc_high=float(row["membership-auc-high"]),
            membership_tpr_1pct=float(row["membership-tpr-1pct"]),
            membership_analysis=str(names[at]),
        )
    for column in ("epsilon-empirical", "epsilon-empirical-fdp"):
        epsilon = leaks.get(column, pd.Series(dtype=float)).to_numpy(dtype=float)
        if len(epsilon) and not np.isnan(epsilon).all():
            out[column.replace("-", "_")] = float(np.nanmax(epsilon))
    f1, analysis = _best(leaks.get("words-f1", pd.Series(dtype=float)).to_numpy(dtype=float), names)
    if analysis:
        prior = leaks["words-prior-f1"].to_numpy(dtype=float)[list(names).index(analysis)]
        out.update(words_f1=f1, words_prior_f1=float(prior), words_analysis=analysis)
    for column, field_name in (
        ("representatives-ssim", "representatives_ssim"),
        ("representatives-cosine", "representatives_cosine"),
    ):
        value, analysis = _best(leaks[column].to_numpy(dtype=float), names)
        if analysis:
            out[field_name] = value
            out["representatives_analysis"] = out.get("representatives_analysis") or analysis
    if out.get("representatives_analysis") and "representatives-ssim-public" in leaks:
        at = list(names).index(out["representatives_analysis"])
        out["representatives_ssim_public"] = float(leaks["representatives-ssim-public"].iloc[at])
    return out


def _label_verdict(leaks: pd.DataFrame, tv: np.ndarray, names: np.ndarray) -> dict[str, Any]:
    """The best label analysis against the best data-free prior (the uniform guess, the
    public data's class mix): its advantage over the prior, and the prior itself as the
    verdict (analysis ``prior``) where no analysis beat it."""
    at = int(np.nanargmin(tv))
    uniform = float(leaks["label-tv-uniform"].to_numpy(dtype=float)[at])
    public = leaks.get("label-tv-public", pd.Series(math.nan, index=leaks.index))
    public_tv = public.to_numpy(dtype=float)
    prior = min(uniform, float(np.nanmin(public_tv))) if not np.isnan(public_tv).all() else uniform
    best = float(tv[at])
    return {
        "label_tv": min(best, prior),
        "label_tv_uniform": uniform,
        "label_analysis": str(names[at]) if best <= prior else PRIOR,
        "label_tv_prior": prior,
        "label_advantage": prior - best,
    }


def victim_verdicts(audit: pd.DataFrame, leaks: pd.DataFrame | None = None) -> pd.DataFrame:
    """One :class:`~fedsim.core.protocol.VerdictRecord` row per (round, client) of ``audit``
    and ``leaks``."""
    leaks = leaks if leaks is not None else pd.DataFrame()
    keys = sorted(
        {
            (int(r), int(c))
            for frame in (audit, leaks)
            if not frame.empty
            for r, c in zip(frame["round"], frame["client"], strict=True)
        }
    )
    if not keys:
        return pd.DataFrame(columns=[protocol.kebab(n) for n in VerdictRecord.__annotations__])
    attacks_by = _groups(audit)
    leaks_by = _groups(leaks)
    rows = [
        victim_verdict(attacks_by.get(key, pd.DataFrame()), leaks_by.get(key)).to_row()
        for key in keys
    ]
    return pd.DataFrame(rows)


def _groups(frame: pd.DataFrame) -> dict[tuple[int, int], pd.DataFrame]:
    if frame.empty:
        return {}
    groups = frame.groupby(["round", "client"], sort=True)
    return {(int(r), int(c)): group for (r, c), group in groups}  # type: ignore[call-overload]


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
        **_leak_round_verdict(rows, seed),
        **_sentences_round(rows, seed),
        protocol.AUDIT_PSNR: median.value,
        protocol.AUDIT_PSNR_LOW: median.low,
        protocol.AUDIT_PSNR_HIGH: median.high,
        protocol.AUDIT_SSIM: _median(rows["ssim"]),
        protocol.AUDIT_LABEL_ACC: _median(rows["label-acc"]),
        protocol.AUDIT_SUCCESS: success.value,
        protocol.AUDIT_SUCCESS_LOW: success.low,
        protocol.AUDIT_SUCCESS_HIGH: success.high,
        protocol.AUDIT_VICTIMS: float((rows["attacks"] > 0).sum()),
        protocol.AUDIT_LOWER_BOUND: float((rows["bound"] != CONVERGED).any()),
    }


def _sentences_round(rows: pd.DataFrame, seed: int) -> dict[str, float]:
    """The median over the round's victims of their best exact-sequence rate (with its 95 %
    bootstrap interval) and ROUGE-1: text reconstruction's verdict (none without it)."""
    if "sentences-exact" not in rows or rows["sentences-exact"].isna().all():
        return {}
    exact = median_interval(rows["sentences-exact"].astype(float).to_numpy(), seed)
    return {
        protocol.AUDIT_SENTENCES_EXACT: exact.value,
        protocol.AUDIT_SENTENCES_EXACT_LOW: exact.low,
        protocol.AUDIT_SENTENCES_EXACT_HIGH: exact.high,
        protocol.AUDIT_SENTENCES_ROUGE1: _median(rows["sentences-rouge1"]),
    }


def _leak_round_verdict(rows: pd.DataFrame, seed: int) -> dict[str, float]:
    """Each other kind's verdict over the round's clients: medians, the label TV's and the
    membership AUC's with 95 % bootstrap intervals."""
    if "label-tv" not in rows:
        return {}
    tv = median_interval(rows["label-tv"].astype(float).to_numpy(), seed)
    auc = median_interval(rows["membership-auc"].astype(float).to_numpy(), seed)
    words = median_interval(rows["words-f1"].astype(float).to_numpy(), seed)
    kinds = ["label-tv", "membership-auc", "representatives-ssim", "words-f1"]
    analysed = rows[kinds].notna().any(axis=1)
    return {
        protocol.AUDIT_LABEL_TV: tv.value,
        protocol.AUDIT_LABEL_TV_LOW: tv.low,
        protocol.AUDIT_LABEL_TV_HIGH: tv.high,
        protocol.AUDIT_LABEL_TV_UNIFORM: _median(rows["label-tv-uniform"]),
        **_advantage_round(rows, seed),
        protocol.AUDIT_MEMBERSHIP_AUC: auc.value,
        protocol.AUDIT_MEMBERSHIP_AUC_LOW: auc.low,
        protocol.AUDIT_MEMBERSHIP_AUC_HIGH: auc.high,
        protocol.AUDIT_MEMBERSHIP_TPR: _median(rows["membership-tpr-1pct"]),
        protocol.AUDIT_REPRESENTATIVES_SSIM: _median(rows["representatives-ssim"]),
        protocol.AUDIT_REPRESENTATIVES_COSINE: _median(rows["representatives-cosine"]),
        # A run folder written before the public bar has no column for it.
        protocol.AUDIT_REPRESENTATIVES_SSIM_PUBLIC: _median(
            rows.get("representatives-ssim-public", pd.Series(dtype=float))
        ),
        protocol.AUDIT_LEAK_CLIENTS: float(analysed.sum()),
        protocol.AUDIT_EPSILON_EMPIRICAL: _highest(rows.get("epsilon-empirical")),
        protocol.AUDIT_EPSILON_EMPIRICAL_FDP: _highest(rows.get("epsilon-empirical-fdp")),
        protocol.AUDIT_WORDS_F1: words.value,
        protocol.AUDIT_WORDS_F1_LOW: words.low,
        protocol.AUDIT_WORDS_F1_HIGH: words.high,
        protocol.AUDIT_WORDS_PRIOR_F1: _median(rows["words-prior-f1"]),
        **_counterfactual_round(rows, seed),
    }


def _advantage_round(rows: pd.DataFrame, seed: int) -> dict[str, float]:
    """The median over the round's clients of the best label analysis's advantage over the
    best prior, with its 95 % bootstrap interval (none in verdicts older than it)."""
    if "label-advantage" not in rows:
        return {}
    advantage = median_interval(rows["label-advantage"].astype(float).to_numpy(), seed)
    return {
        protocol.AUDIT_LABEL_TV_PRIOR: _median(rows["label-tv-prior"]),
        protocol.AUDIT_LABEL_ADVANTAGE: advantage.value,
        protocol.AUDIT_LABEL_ADVANTAGE_LOW: advantage.low,
        protocol.AUDIT_LABEL_ADVANTAGE_HIGH: advantage.high,
    }


def _counterfactual_round(rows: pd.DataFrame, seed: int) -> dict[str, float]:
    if "counterfactual-psnr" not in rows or rows["counterfactual-psnr"].isna().all():
        return {}
    median = median_interval(rows["counterfactual-psnr"].astype(float).to_numpy(), seed)
    return {
        protocol.AUDIT_COUNTERFACTUAL_PSNR: median.value,
        protocol.AUDIT_COUNTERFACTUAL_PSNR_LOW: median.low,
        protocol.AUDIT_COUNTERFACTUAL_PSNR_HIGH: median.high,
    }


def _highest(values: pd.Series | None) -> float:
    known = values.astype(float).dropna() if values is not None else pd.Series(dtype=float)
    return float(known.max()) if len(known) else math.nan


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
    """The round's verdict in one terminal line: reconstruction, then each other kind."""
    parts = []
    victims = int(verdict[protocol.AUDIT_VICTIMS])
    exact = verdict.get(protocol.AUDIT_SENTENCES_EXACT, math.nan)
    if victims and not math.isnan(exact):
        low = verdict.get(protocol.AUDIT_SENTENCES_EXACT_LOW, math.nan)
        high = verdict.get(protocol.AUDIT_SENTENCES_EXACT_HIGH, math.nan)
        rouge1 = verdict.get(protocol.AUDIT_SENTENCES_ROUGE1, math.nan)
        rows = verdicts[verdicts["round"] == server_round]
        strongest = strongest_attacks(rows["sentences-attack"])
        parts.append(
            f"sentences exact {_with_interval(exact, low, high, 2)}, ROUGE-1 {rouge1:.3f} "
            f"(median over {victims} victim{'s' if victims != 1 else ''}), strongest: {strongest}"
        )
    elif victims:
        psnr = verdict[protocol.AUDIT_PSNR]
        low, high = verdict[protocol.AUDIT_PSNR_LOW], verdict[protocol.AUDIT_PSNR_HIGH]
        interval = "" if math.isnan(low) else f" [{low:.1f}, {high:.1f}]"
        bound = LOWER_BOUND if verdict[protocol.AUDIT_LOWER_BOUND] else CONVERGED
        strongest = strongest_attacks(verdicts[verdicts["round"] == server_round]["psnr-attack"])
        parts.append(
            f"PSNR {psnr:.2f} dB{interval} (median over {victims} "
            f"victim{'s' if victims != 1 else ''}; {bound}), strongest: {strongest}"
        )
    parts += leak_verdict_parts(verdict)
    probe = verdict.get(protocol.AUDIT_COUNTERFACTUAL_PSNR, math.nan)
    if not math.isnan(probe):
        low = verdict.get(protocol.AUDIT_COUNTERFACTUAL_PSNR_LOW, math.nan)
        high = verdict.get(protocol.AUDIT_COUNTERFACTUAL_PSNR_HIGH, math.nan)
        parts.append(
            f"counterfactual probe (never received): PSNR {_with_interval(probe, low, high, 1)} dB"
        )
    return f"  audit round {server_round} verdict: " + ("; ".join(parts) or "nothing audited")


def _with_interval(value: float, low: float, high: float, digits: int) -> str:
    interval = "" if math.isnan(low) else f" [{low:.{digits}f}, {high:.{digits}f}]"
    return f"{value:.{digits}f}{interval}"


def _labels_phrase(verdict: dict[str, float], tv: str) -> str:
    """``labels TV ... (uniform guess ...)``, with the advantage over the best prior and,
    where the analyses did not beat it (advantage's interval at or below 0), so said."""
    get = verdict.get
    phrase = f"labels TV {tv} (uniform guess {get(protocol.AUDIT_LABEL_TV_UNIFORM, math.nan):.2f}"
    advantage = get(protocol.AUDIT_LABEL_ADVANTAGE, math.nan)
    if math.isnan(advantage):
        return phrase + ")"
    low = get(protocol.AUDIT_LABEL_ADVANTAGE_LOW, math.nan)
    high = get(protocol.AUDIT_LABEL_ADVANTAGE_HIGH, math.nan)
    phrase += (
        f", best prior {get(protocol.AUDIT_LABEL_TV_PRIOR, math.nan):.2f}; "
        f"advantage {_with_interval(advantage, low, high, 2)})"
    )
    if not (high > 0 if not math.isnan(high) else advantage > 0):
        phrase += ": no leak beyond the prior"
    return phrase


def leak_verdict_parts(verdict: dict[str, float]) -> list[str]:
    """The other kinds of a round's verdict, one phrase each (absent kinds left out)."""
    get = verdict.get
    parts = []
    tv = get(protocol.AUDIT_LABEL_TV, math.nan)
    if not math.isnan(tv):
        text = _with_interval(
            tv,
            get(protocol.AUDIT_LABEL_TV_LOW, math.nan),
            get(protocol.AUDIT_LABEL_TV_HIGH, math.nan),
            2,
        )
        parts.append(_labels_phrase(verdict, text))
    auc = get(protocol.AUDIT_MEMBERSHIP_AUC, math.nan)
    if not math.isnan(auc):
        text = _with_interval(
            auc,
            get(protocol.AUDIT_MEMBERSHIP_AUC_LOW, math.nan),
            get(protocol.AUDIT_MEMBERSHIP_AUC_HIGH, math.nan),
            3,
        )
        tpr = get(protocol.AUDIT_MEMBERSHIP_TPR, math.nan)
        parts.append(f"membership AUC {text}, TPR@1%FPR {tpr:.3f}")
    ssim = get(protocol.AUDIT_REPRESENTATIVES_SSIM, math.nan)
    cosine = get(protocol.AUDIT_REPRESENTATIVES_COSINE, math.nan)
    public = get(protocol.AUDIT_REPRESENTATIVES_SSIM_PUBLIC, math.nan)
    if not math.isnan(ssim):
        bar = "" if math.isnan(public) else f", public class means {public:.3f}"
        parts.append(f"representatives SSIM {ssim:.3f}{bar}")
    elif not math.isnan(cosine):
        parts.append(f"representatives feature cosine {cosine:.3f}")
    f1 = get(protocol.AUDIT_WORDS_F1, math.nan)
    if not math.isnan(f1):
        low, high = (
            get(protocol.AUDIT_WORDS_F1_LOW, math.nan),
            get(protocol.AUDIT_WORDS_F1_HIGH, math.nan),
        )
        prior = get(protocol.AUDIT_WORDS_PRIOR_F1, math.nan)
        parts.append(f"words F1 {_with_interval(f1, low, high, 3)} (frequency prior {prior:.3f})")
    clients = int(get(protocol.AUDIT_LEAK_CLIENTS, 0.0) or 0)
    if parts:
        parts[-1] += f" (median over {clients} client{'s' if clients != 1 else ''})"
    return parts
