"""Tokens: LEAF's 80 characters, or a word vocabulary with an out-of-vocabulary token.

A :class:`Vocabulary` maps text to token ids and back. The word vocabulary keeps
the canary tokens (:data:`CANARY_TOKENS`: the numerals and a few words of a
secret's context) in vocabulary whatever the text, so a canary planted in a
client (``my pin is 4 8 1 5``) is never read as out-of-vocabulary tokens.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

LEAF_CHARACTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
"""LEAF's Shakespeare alphabet (``ALL_LETTERS`` in its ``language_utils``): 80 characters."""

OOV = "<oov>"
CANARY_TOKENS = ("my", "pin", "is", "secret", *(str(d) for d in range(10)))
"""Tokens every word vocabulary holds: a canary's context words and its digits."""

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*|[0-9]|[.,!?;:]")


def words(text: str) -> list[str]:
    """Lower-cased words, single digits and punctuation marks, in order."""
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Vocabulary:
    """Tokens by id; ``level`` ``"char"`` or ``"word"``; unknown text maps to ``unknown``."""

    tokens: tuple[str, ...]
    level: str
    unknown: int

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def index(self) -> dict[str, int]:
        """Each token's id, built once: every client's canary encodes with it."""
        return {token: i for i, token in enumerate(self.tokens)}

    def encode(self, text: str) -> np.ndarray:
        """``text`` as token ids (int64)."""
        index, pieces = self.index, text if self.level == "char" else words(text)
        return np.array([index.get(p, self.unknown) for p in pieces], dtype=np.int64)

    def decode(self, ids: Sequence[int]) -> list[str]:
        """The tokens of ``ids``."""
        return [self.tokens[int(i)] for i in ids]


def char_vocabulary() -> Vocabulary:
    """LEAF's 80 characters; any other character reads as a space."""
    return Vocabulary(tuple(LEAF_CHARACTERS), "char", LEAF_CHARACTERS.index(" "))


def word_vocabulary(texts: Iterable[str], size: int) -> Vocabulary:
    """The out-of-vocabulary token, :data:`CANARY_TOKENS`, then the most frequent other
    words of ``texts`` (ties by first appearance) up to ``size`` tokens."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(words(text))
    reserved = (OOV, *CANARY_TOKENS)
    common = [w for w, _ in counts.most_common() if w not in reserved]
    return Vocabulary((*reserved, *common[: size - len(reserved)]), "word", 0)


def windows(ids: np.ndarray, length: int) -> np.ndarray:
    """Consecutive windows of ``length + 1`` tokens (input and next-token target), each
    starting where the last one's inputs end; ``(0, length + 1)`` when ``ids`` is shorter."""
    count = max(0, (len(ids) - 1) // length)
    if count == 0:
        return np.zeros((0, length + 1), dtype=np.int64)
    starts = np.arange(count) * length
    return ids[starts[:, None] + np.arange(length + 1)[None, :]]
