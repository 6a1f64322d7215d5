"""The words a text client used, as the audit read them: the summary's and report's table.

From ``leaks.csv``'s ``words`` rows of the last audited round: per client, the
tokens the analysis read from the update against those the client fed its model
(token ids there; the run's vocabulary gives the words here), with what it
missed and what it named that the client never used.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedsim.core.data import load_dataset
from fedsim.core.scenario_file import load_scenario
from fedsim.outputs.run_folder import SCENARIO_FILE
from fedsim.outputs.tables import Column, Table, number_text

SHOWN = 24
"""Recovered words shown per client: the rarest (the vocabulary is ordered by frequency)."""

WORD_COLUMNS = (
    Column("client", "client"),
    Column("found", "words read"),
    Column("true", "words used"),
    Column("f1", "F1"),
    Column("prior-f1", "frequency prior's F1"),
    Column("recovered", f"read from the update (the {SHOWN} rarest)", "text"),
    Column("missed", "missed", "text"),
    Column("extra", "named, never used", "text"),
)


def _ids(text: object) -> list[int]:
    return [int(i) for i in str(text).split(";") if i] if isinstance(text, str) else []


def word_table(run_dir: Path, leaks: pd.DataFrame) -> Table | None:
    """The last audited round's word sets, one row per client (``None`` without any)."""
    if leaks.empty or "words-f1" not in leaks:
        return None
    words = leaks[leaks["kind"] == "words"]
    if words.empty:
        return None
    last = words[words["round"] == words["round"].max()].sort_values("client")
    vocabulary = load_dataset(load_scenario(run_dir / SCENARIO_FILE).data).vocabulary

    def text(ids: list[int]) -> str:
        return " ".join(vocabulary[i] for i in ids) or "-"

    rows = []
    for _, row in last.iterrows():
        found, true = _ids(row["words-estimate"]), _ids(row["words-truth"])
        rows.append(
            {
                "client": str(int(row["client"])),
                "found": str(len(found)),
                "true": str(len(true)),
                "f1": number_text(float(row["words-f1"]), 3),
                "prior-f1": number_text(float(row["words-prior-f1"]), 3),
                "recovered": text(found[-SHOWN:]),
                "missed": text(sorted(set(true) - set(found))),
                "extra": text(sorted(set(found) - set(true))),
            }
        )
    return Table(WORD_COLUMNS, tuple(rows))


def words_summary_lines(run_dir: Path, leaks: pd.DataFrame) -> list[str]:
    """The word-set table in markdown with its caption (nothing without words rows)."""
    table = word_table(run_dir, leaks)
    if table is None:
        return []
    server_round = int(leaks[leaks["kind"] == "words"]["round"].max())
    return [
        f"Words, round {server_round}: the tokens each client's update named (the token-"
        "embedding rows its data moved) against the tokens it fed its model; every round's "
        "in `leaks.csv` (`words-estimate`, `words-truth`, token ids).",
        "",
        table.markdown(),
        "",
    ]
