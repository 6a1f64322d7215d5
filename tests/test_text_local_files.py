"""Text from local table files through Flower Datasets (``flwr-local-text``, ``-words``):
real Shakespeare lines written as parquet, CSV and JSON lines, grouped by speaker."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fedsim.core.config import DataConfig, ScenarioError
from fedsim.core.data import DATASETS, load_dataset
from fedsim.core.modality import TEXT, modality_of
from fedsim.text.local_files import grouped_texts
from fedsim.text.shakespeare import roles
from fedsim.text.tokens import OOV, words

SPEAKERS = 4


def _lines() -> pd.DataFrame:
    """The first roles' lines, one row each, interleaved as a play's transcript would be."""
    rows = [
        (n, line.strip(), f"role-{n}")
        for n, role in enumerate(roles()[:SPEAKERS])
        for line in role.text.splitlines()
        if line.strip()
    ]
    frame = pd.DataFrame(rows, columns=["order", "text", "speaker"])
    frame["order"] = frame.groupby("speaker").cumcount()
    return frame.sort_values(["order", "speaker"], kind="stable")[["speaker", "text"]]


def _write(frame: pd.DataFrame, path: Path) -> Path:
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True)
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_each_speaker_is_one_group_of_its_lines_in_order(tmp_path: Path, suffix: str) -> None:
    frame = _lines()
    texts = grouped_texts(str(_write(frame, tmp_path / f"lines{suffix}")))

    assert len(texts) == SPEAKERS
    for text, (_, rows) in zip(texts, frame.groupby("speaker", sort=False), strict=True):
        assert text == "\n".join(rows["text"])


def test_word_windows_of_each_speaker_are_its_clients_data(tmp_path: Path) -> None:
    root = _write(_lines(), tmp_path / "lines.parquet")
    bundle = load_dataset(DataConfig(dataset="flwr-local-text-words", root=str(root)))

    assert modality_of(DATASETS.get("flwr-local-text-words")) == TEXT
    assert set(bundle.train_labels.tolist()) == set(range(SPEAKERS))
    assert bundle.train_images.shape[1] == 21  # 20 words read, the next predicted
    # Each speaker's windows hold its own words only (or the out-of-vocabulary token).
    lines = _lines()
    for group in range(SPEAKERS):
        own = set(words(" ".join(lines.query(f"speaker == 'role-{group}'")["text"]))) | {OOV}
        ids = bundle.train_images[bundle.train_labels == group].unique()
        assert {bundle.vocabulary[int(i)] for i in ids} <= own


@pytest.mark.parametrize(
    ("make", "allowed"),
    [
        (lambda p: p / "missing.csv", "a .csv, .json, .jsonl, .parquet file or a folder"),
        (lambda p: _write(pd.DataFrame({"n": [1, 2]}), p / "numbers.csv"), "no string column"),
        (
            lambda p: (
                _write(_lines(), p / "a.csv"),
                _write(_lines(), p / "b.jsonl"),
                p,
            )[-1],
            "mixes formats (csv, json)",
        ),
        (lambda p: (p / "notes.md").write_text("x") and p, "holds no .csv, .json"),
    ],
)
def test_what_is_not_a_text_table_is_one_line(tmp_path: Path, make, allowed: str) -> None:
    root = make(tmp_path)
    with pytest.raises(ScenarioError, match=r"data\.root") as err:
        load_dataset(DataConfig(dataset="flwr-local-text", root=str(root)))
    assert allowed in str(err.value) and "\n" not in str(err.value)
