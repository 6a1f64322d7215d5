"""Text datasets by name: LEAF's Shakespeare and a folder of a researcher's own text files.

Each gives a :class:`~fedsim.core.raw.RawDataset` of modality ``text``: windows
of ``T + 1`` token ids (a model reads the first ``T`` and predicts the next
token at each position), each labelled with its group, the speaking role or the
file it comes from, which the ``groups`` partitioner makes a client each. Every
twentieth window of each group (windows 19, 39, ...) is held out as the server's test
set. No download: the plays ship in the ``shakespeare`` package.

- ``shakespeare``: LEAF's next-character task, 80-character windows over LEAF's
  80 characters.
- ``shakespeare-words``: 20-word windows over the 2,000 tokens of
  :func:`~fedsim.text.tokens.word_vocabulary` (the out-of-vocabulary token, the
  canary tokens, the most frequent words of the plays).
- ``text-folder``, ``text-folder-words``: the same from the ``*.txt`` files in
  ``data.root`` (one group per file); the words' vocabulary is the folder's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from fedsim.core.config import DataConfig, ScenarioError
from fedsim.core.data import DATASETS
from fedsim.core.modality import TEXT
from fedsim.core.models import InputSpec
from fedsim.core.raw import RawDataset
from fedsim.text.shakespeare import roles
from fedsim.text.tokens import Vocabulary, char_vocabulary, windows, word_vocabulary

CHAR_WINDOW = 80
WORD_WINDOW = 20
WORD_VOCABULARY = 2000
HOLD_OUT_EVERY = 20
"""Window 19, 39, 59, ... of each group is a test window."""


def grouped_windows(texts: Sequence[str], vocabulary: Vocabulary, length: int) -> RawDataset:
    """Each text's windows, labelled with the text's index, every twentieth held out."""
    parts: dict[bool, tuple[list[np.ndarray], list[np.ndarray]]] = {True: ([], []), False: ([], [])}
    for group, text in enumerate(texts):
        cut = windows(vocabulary.encode(text), length)
        test = np.arange(len(cut)) % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1
        for held, mask in ((True, test), (False, ~test)):
            parts[held][0].append(cut[mask])
            parts[held][1].append(np.full(int(mask.sum()), group, dtype=np.int64))
    (xtr, ytr), (xte, yte) = ([np.concatenate(a) for a in parts[h]] for h in (False, True))
    return RawDataset(
        xtr, ytr, xte, yte, len(vocabulary), modality=TEXT, vocabulary=vocabulary.tokens
    )


def text_loader(
    level: str, length: int
) -> Callable[[Callable[[DataConfig], Sequence[str]]], Callable[[DataConfig], RawDataset]]:
    """A loader of ``level`` (``char`` or ``word``) windows of ``length`` tokens over the
    texts the decorated function gives; it declares its modality and shapes for validation."""

    def decorator(texts_of: Callable[[DataConfig], Sequence[str]]) -> Callable[..., RawDataset]:
        def load(cfg: DataConfig) -> RawDataset:
            texts = texts_of(cfg)
            if level == "char":
                vocabulary = char_vocabulary()
            else:
                vocabulary = word_vocabulary(texts, WORD_VOCABULARY)
            return grouped_windows(texts, vocabulary, length)

        size = len(char_vocabulary()) if level == "char" else WORD_VOCABULARY
        load.modality = TEXT  # type: ignore[attr-defined]
        load.input_spec = lambda: InputSpec(1, length, size, modality=TEXT)  # type: ignore[attr-defined]
        return load

    return decorator


def _plays(cfg: DataConfig) -> list[str]:
    return [role.text for role in roles()]


@functools.lru_cache(maxsize=4)
def folder_texts(root: str) -> tuple[str, ...]:
    """The ``*.txt`` files in ``root`` (sorted by name), one text each."""
    folder = Path(root).expanduser()
    files = sorted(folder.glob("*.txt")) if root and folder.is_dir() else []
    if not files:
        raise ScenarioError(
            "data.root", root, "a folder of .txt files (one client's text per file)"
        )
    return tuple(path.read_text(encoding="utf-8", errors="replace") for path in files)


def _folder(cfg: DataConfig) -> tuple[str, ...]:
    return folder_texts(cfg.root)


_ROLES = "one group per speaking role of each play"
DATASETS.register(
    "shakespeare", f"LEAF's Shakespeare: next character over 80-character windows, {_ROLES}"
)(text_loader("char", CHAR_WINDOW)(_plays))
DATASETS.register(
    "shakespeare-words",
    f"Shakespeare by word: 20-word windows, 2,000-token vocabulary with <oov>, {_ROLES}",
)(text_loader("word", WORD_WINDOW)(_plays))
DATASETS.register(
    "text-folder", "the .txt files in data.root, one group per file: next character (LEAF's 80)"
)(text_loader("char", CHAR_WINDOW)(_folder))
DATASETS.register(
    "text-folder-words",
    "the .txt files in data.root, one group per file: next word (the folder's 2,000 words)",
)(text_loader("word", WORD_WINDOW)(_folder))
