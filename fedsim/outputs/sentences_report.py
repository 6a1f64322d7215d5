"""The sentences a text client's upload gave back, as the audit scored them: the summary's
and report's tables.

From ``audit.csv``'s text rows (``exact-rate`` set): the round's verdict (the median over
victims of each victim's best exact-sequence rate, with its 95 % bootstrap interval), and
for the last audited round each text attack's recovered sequences under the truth, with the
tokens it got wrong in brackets (token ids there; the run's vocabulary gives the words).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from fedsim.core.data import load_dataset
from fedsim.core.metrics import median_interval
from fedsim.core.scenario_file import load_scenario
from fedsim.outputs.run_folder import SCENARIO_FILE
from fedsim.outputs.tables import Column, Table, number_text
from fedsim.outputs.verdict import strongest_attacks

SHOWN = 2
"""Recovered sequences shown per victim and attack."""

ROUND_COLUMNS = (
    Column("round", "round"),
    Column("victims", "victims"),
    Column("exact", "sequences exact (median)"),
    Column("interval", "95 % interval", "text"),
    Column("rouge1", "ROUGE-1 (median)"),
    Column("strongest", "strongest", "text"),
)
SENTENCE_COLUMNS = (
    Column("client", "client"),
    Column("attack", "attack", "text"),
    Column("exact", "exact"),
    Column("token-acc", "token acc."),
    Column("rouge1", "ROUGE-1"),
    Column("rouge2", "ROUGE-2"),
    Column("rouge-l", "ROUGE-L"),
    Column("sentence", "recovered [wrong tokens] / truth", "text"),
)


def text_rows(audit: pd.DataFrame) -> pd.DataFrame:
    """The rows of text attacks (scored on token sequences)."""
    if audit.empty or "exact-rate" not in audit:
        return audit.iloc[0:0]
    return audit[audit["exact-rate"].notna()]


def sentences_round_table(verdicts: pd.DataFrame, seed: int) -> Table | None:
    """Per round, the text reconstruction verdict (``None`` without text attacks)."""
    if "sentences-exact" not in verdicts or verdicts["sentences-exact"].isna().all():
        return None
    rows = []
    for server_round, group in verdicts[verdicts["sentences-exact"].notna()].groupby("round"):
        exact = median_interval(group["sentences-exact"].to_numpy(dtype=float), seed)
        interval = "-" if math.isnan(exact.low) else f"{exact.low:.2f} to {exact.high:.2f}"
        rows.append(
            {
                "round": str(server_round),
                "victims": str(len(group)),
                "exact": number_text(exact.value, 2),
                "interval": interval,
                "rouge1": number_text(float(group["sentences-rouge1"].median()), 3),
                "strongest": strongest_attacks(group["sentences-attack"]),
            }
        )
    return Table(ROUND_COLUMNS, tuple(rows))


def _sequences(text: object) -> list[list[int]]:
    if not isinstance(text, str) or not text:
        return []
    return [[int(t) for t in part.split(";") if t] for part in text.split("|")]


def sentence_table(run_dir: Path, audit: pd.DataFrame) -> Table | None:
    """The last audited round's recovered sequences, one row per victim and text attack."""
    rows = text_rows(audit)
    if rows.empty:
        return None
    last = rows[rows["round"] == rows["round"].max()].sort_values(["client", "attack"])
    vocabulary = load_dataset(load_scenario(run_dir / SCENARIO_FILE).data).vocabulary
    out = []
    for _, row in last.iterrows():
        pairs = zip(_sequences(row["text-recovered"]), _sequences(row["text-truth"]), strict=False)
        shown = []
        for ours, truth in list(pairs)[:SHOWN]:
            words = [
                vocabulary[o] if o == t else f"[{vocabulary[o]}]"
                for o, t in zip(ours, truth, strict=False)
            ]
            shown.append(
                f"{' '.join(words) or '(nothing)'} / {' '.join(vocabulary[t] for t in truth)}"
            )
        out.append(
            {
                "client": str(int(row["client"])),
                "attack": str(row["attack"]),
                "exact": number_text(float(row["exact-rate"]), 2),
                "token-acc": number_text(float(row["token-acc"]), 3),
                "rouge1": number_text(float(row["rouge1"]), 3),
                "rouge2": number_text(float(row["rouge2"]), 3),
                "rouge-l": number_text(float(row["rouge-l"]), 3),
                "sentence": " // ".join(shown) or "-",
            }
        )
    return Table(SENTENCE_COLUMNS, tuple(out))


def sentences_summary_lines(
    run_dir: Path, audit: pd.DataFrame, verdicts: pd.DataFrame, seed: int
) -> list[str]:
    """The text reconstruction verdict and the last round's sentences, in markdown."""
    verdict = sentences_round_table(verdicts, seed)
    table = sentence_table(run_dir, audit)
    if verdict is None or table is None:
        return []
    return [
        "Sentences, per round: for each victim the best share of its sequences any text "
        "attack recovered token for token, then the median over the round's victims with a "
        "95 % bootstrap interval, and the median best ROUGE-1 (on token ids).",
        "",
        verdict.markdown(),
        "",
        f"Sentences, round {int(text_rows(audit)['round'].max())}: each text attack's recovered "
        f"sequences (the first {SHOWN}) under the truth, wrong tokens in brackets; every "
        "round's in `audit.csv` (`text-recovered`, `text-truth`, token ids).",
        "",
        table.markdown(),
        "",
    ]
