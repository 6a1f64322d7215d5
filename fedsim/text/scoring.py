"""Text reconstruction scores: recovered token sequences against the victim's true ones.

Only the scorer calls this (ground truth never reaches an attack). Each true sequence is
paired with at most one recovered sequence (the assignment maximising matched tokens,
:func:`scipy.optimize.linear_sum_assignment`); an unpaired true sequence scores zero.
ROUGE is computed on token ids (ROUGE-1 and ROUGE-2: F1 of the clipped unigram and bigram
overlap; ROUGE-L: the F1 of the longest common subsequence), as ``rouge-score`` computes
it on words, without its tokeniser or stemmer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment


@dataclass(frozen=True)
class TextScore:
    """Means over the true sequences of their paired recovery's scores."""

    exact_rate: float  # true sequences recovered token for token
    token_accuracy: float  # tokens equal at their position
    rouge1: float
    rouge2: float
    rouge_l: float
    recovered: int  # true sequences recovered exactly
    found: int  # sequences the attack returned


def _f1(overlap: int, recovered: int, truth: int) -> float:
    if not overlap:
        return 0.0
    return 2 * overlap / (recovered + truth)


def rouge_n(recovered: Sequence[int], truth: Sequence[int], n: int) -> float:
    """ROUGE-N F1 of two token sequences (clipped n-gram counts)."""
    grams = [Counter(zip(*(s[i:] for i in range(n)), strict=False)) for s in (recovered, truth)]
    overlap = sum((grams[0] & grams[1]).values())
    return _f1(overlap, sum(grams[0].values()), sum(grams[1].values()))


def lcs_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common subsequence of ``a`` and ``b``."""
    row = [0] * (len(b) + 1)
    for x in a:
        previous = 0
        for j, y in enumerate(b, start=1):
            previous, row[j] = row[j], previous + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l(recovered: Sequence[int], truth: Sequence[int]) -> float:
    """ROUGE-L F1 (beta 1) of two token sequences."""
    return _f1(lcs_length(recovered, truth), len(recovered), len(truth))


def _pairs(
    recovered: torch.Tensor, truth: torch.Tensor
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Token accuracy of each (true, recovered) pair ``(N, S)`` and the assignment."""
    matches = (truth.unsqueeze(1) == recovered.unsqueeze(0)).double().mean(-1).numpy()
    rows, cols = linear_sum_assignment(-matches)
    return matches, [(int(r), int(c)) for r, c in zip(rows, cols, strict=True)]


def _cut(recovered: torch.Tensor, truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    found = recovered.long().cpu()
    length = found.shape[1] if len(found) else truth.shape[1]
    truth = truth.long().cpu()[:, :length]
    return found[:, : truth.shape[1]], truth


def paired_ids(recovered: torch.Tensor, truth: torch.Tensor) -> tuple[str, str]:
    """The paired sequences as token-id text, recovered and true in the same order
    (``"|"`` between sequences, ``";"`` between tokens; an unpaired truth under an empty
    recovery)."""
    found, truth = _cut(recovered, truth)
    by_truth = dict(_pairs(found, truth)[1]) if len(found) and len(truth) else {}

    def ids(row: torch.Tensor | None) -> str:
        return "" if row is None else ";".join(str(int(t)) for t in row)

    ours = [ids(found[by_truth[r]] if r in by_truth else None) for r in range(len(truth))]
    return "|".join(ours), "|".join(ids(row) for row in truth)


def score_sequences(recovered: torch.Tensor, truth: torch.Tensor) -> TextScore:
    """``recovered`` ``(S, T)`` against ``truth`` ``(N, T')``; only the first ``T`` tokens
    of each true sequence count when ``T' > T`` (an attack on a model's inputs recovers the
    ``T`` tokens it reads, not the last window token, which is only predicted)."""
    cut, truth = _cut(recovered, truth)
    if not len(cut) or not len(truth):
        return TextScore(0.0, 0.0, 0.0, 0.0, 0.0, 0, len(cut))
    matches, pairs = _pairs(cut, truth)
    n = len(truth)
    accuracy = np.zeros(n)
    scores = np.zeros((n, 3))
    for r, c in pairs:
        ours, theirs = cut[c].tolist(), truth[r].tolist()
        accuracy[r] = matches[r, c]
        scores[r] = rouge_n(ours, theirs, 1), rouge_n(ours, theirs, 2), rouge_l(ours, theirs)
    exact = int((accuracy == 1.0).sum())
    means = scores.mean(axis=0)
    return TextScore(
        exact / n,
        float(accuracy.mean()),
        float(means[0]),
        float(means[1]),
        float(means[2]),
        exact,
        len(cut),
    )
