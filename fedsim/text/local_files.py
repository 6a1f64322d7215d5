"""Text from a researcher's own table files through Flower Datasets' ``FederatedDataset``.

``data.root`` is a ``.parquet``, ``.csv``, ``.json`` or ``.jsonl`` file, or a folder of
files of one of those formats, loaded offline by Hugging Face's builder of that format
through ``FederatedDataset``. The text is the column ``text`` (else the first string
column); the rows are grouped by the first other scalar column (a speaker, an author, a
client id), each group's texts joined in file order into one group, which the ``groups``
partitioner makes a client; without such a column every row is a group. The windows
and test hold-out are as in :mod:`fedsim.text.data`:

- ``flwr-local-text``: next character over 80-character windows;
- ``flwr-local-text-words``: next word over 20-word windows, the files' own 2,000 words.

Every refusal is one :class:`~fedsim.core.config.ScenarioError` on ``data.root``.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

from fedsim.core.config import DataConfig, ScenarioError, first_line
from fedsim.core.data import DATASETS
from fedsim.core.flower_datasets import INDEX, offline_import
from fedsim.text.data import CHAR_WINDOW, WORD_WINDOW, text_loader

BUILDERS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}
"""File suffix -> the Hugging Face builder that reads it (all built in: no download)."""

TEXT_COLUMN = "text"


def _refuse(root: str, allowed: str) -> ScenarioError:
    return ScenarioError("data.root", root, allowed)


def _files(root: str) -> tuple[str, list[str]]:
    """The builder and the files of ``root``, or a one-line refusal."""
    formats = ", ".join(sorted(BUILDERS))
    path = Path(root).expanduser()
    if not root or not path.exists():
        raise _refuse(root, f"a {formats} file or a folder of them (one format)")
    if path.is_file():
        files = [path] if path.suffix in BUILDERS else []
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in BUILDERS)
    if not files:
        raise _refuse(root, f"holds no {formats} file")
    builders = sorted({BUILDERS[f.suffix] for f in files})
    if len(builders) > 1:
        raise _refuse(root, f"mixes formats ({', '.join(builders)}): keep one format per folder")
    return builders[0], [str(f) for f in files]


def _columns(features: Any, root: str) -> tuple[str, str | None]:
    """The text column and the grouping column (``None``: a group per row)."""
    datasets = offline_import("datasets")
    strings = [
        n
        for n, f in features.items()
        if isinstance(f, datasets.Value) and f.dtype in ("string", "large_string")
    ]
    text = TEXT_COLUMN if TEXT_COLUMN in strings else (strings[0] if strings else None)
    if text is None:
        raise _refuse(root, f"has no string column for the text; columns: {', '.join(features)}")
    scalars = [
        n for n, f in features.items() if isinstance(f, datasets.Value) and n not in (text, INDEX)
    ]
    return text, (scalars[0] if scalars else None)


@functools.lru_cache(maxsize=4)
def grouped_texts(root: str) -> tuple[str, ...]:
    """The texts of ``root``'s rows, joined per group in order of first appearance."""
    builder, files = _files(root)
    federated = offline_import("flwr_datasets").FederatedDataset
    with tempfile.TemporaryDirectory(prefix="fedsim-hf-") as cache:
        try:
            table = federated(
                dataset=builder,
                partitioners={"train": 1},
                shuffle=False,
                cache_dir=cache,
                keep_in_memory=True,
                data_files={"train": files},
            ).load_split("train")
        except Exception as err:  # Hugging Face's loaders raise many types; one line each
            raise _refuse(
                root,
                f"holds no {builder} table Flower Datasets loads "
                f"({type(err).__name__}: {first_line(err)})",
            ) from None
        text, group = _columns(table.features, root)
        texts = list(table[text])
        groups = list(table[group]) if group else list(range(len(texts)))
    joined: dict[Any, list[str]] = {}
    for key, line in zip(groups, texts, strict=True):
        if line:  # an empty cell (CSV's missing value) adds nothing
            joined.setdefault(key, []).append(str(line))
    if not joined:
        raise _refuse(root, f"holds no text in column {text!r}")
    return tuple("\n".join(lines) for lines in joined.values())


def _local(cfg: DataConfig) -> tuple[str, ...]:
    return grouped_texts(cfg.root)


DATASETS.register(
    "flwr-local-text",
    "local parquet/CSV/JSON text through Flower Datasets, a group per speaker column: next "
    "character (LEAF's 80)",
)(text_loader("char", CHAR_WINDOW)(_local))
DATASETS.register(
    "flwr-local-text-words",
    "local parquet/CSV/JSON text through Flower Datasets, a group per speaker column: next "
    "word (the files' 2,000 words)",
)(text_loader("word", WORD_WINDOW)(_local))
