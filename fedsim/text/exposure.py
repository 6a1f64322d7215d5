"""Carlini et al.'s exposure of planted canaries ("The Secret Sharer", USENIX Security 2019).

A canary is a fixed prefix followed by a secret drawn from a randomness space ``R`` (e.g.
"my pin is" + 4 digits: ``|R| = 10**4``). A model's log-perplexity of a sequence is
``-sum_i log2 p(x_i | x_<i)`` over the secret's positions; the canary's rank is the number of
secrets in ``R`` whose log-perplexity is at most the canary's, and

    exposure = log2 |R| - log2 rank,

between 0 (the model prefers nothing about it) and ``log2 |R|`` (it ranks the canary first).
Where ``R`` is small enough to score every secret the rank is exact. Otherwise the paper's
extrapolation applies: fit a skew-normal distribution to the log-perplexities of random
secrets and read the exposure as ``-log2 CDF(canary's log-perplexity)``.

Scoring all of ``R`` (:func:`space_log_perplexity`) reads the model as a trie: a causal
model's logits at a position depend on the tokens up to it alone, so one forward pass of
the ``|A|**(L-1)`` sequences "prefix + the first L-1 secret tokens" gives every secret's
log-perplexity (the last position's softmax scores all ``|A|`` last tokens at once), and
each position's softmax is taken once per distinct context (``1 + |A| + ... + |A|**(L-1)``
of them). ``|R| = 10,000`` then costs about what 1,000 random secrets cost scored one by
one. A model that is not causal is refused (the planted canaries' own log-perplexities,
scored whole, must match).

The model is any causal module mapping token ids ``(B, T)`` to next-token logits
``(B, T, V)``; this module knows nothing of how the canary's tokens were made or where it
was planted.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class CanaryFormat:
    """A canary's shape: a fixed prefix, then ``length`` secret tokens from ``alphabet``."""

    prefix: tuple[int, ...]
    alphabet: tuple[int, ...]
    length: int

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ValueError("a canary needs a prefix of at least one token (the model's context)")
        if len(set(self.alphabet)) != len(self.alphabet) or len(self.alphabet) < 2:
            raise ValueError("a canary's alphabet needs at least 2 distinct tokens")
        if self.length < 1:
            raise ValueError(f"a canary's secret length must be >= 1, got {self.length}")

    @property
    def space_size(self) -> int:
        """``|R|``: how many secrets the format admits."""
        return len(self.alphabet) ** self.length

    def sequence(self, secret: Sequence[int]) -> torch.Tensor:
        """The canary with ``secret`` (token ids from the alphabet) as one long tensor."""
        if len(secret) != self.length or not set(secret) <= set(self.alphabet):
            raise ValueError(
                f"a secret must be {self.length} tokens from the alphabet {self.alphabet}, "
                f"got {tuple(secret)}"
            )
        return torch.tensor((*self.prefix, *secret), dtype=torch.long)

    def draw(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` canaries with secrets drawn uniformly from ``R``: ``(n, len(prefix)+length)``."""
        alphabet = torch.tensor(self.alphabet, dtype=torch.long)
        picks = torch.randint(len(self.alphabet), (n, self.length), generator=generator)
        return self._with_prefix(alphabet[picks])

    def every_secret(self) -> torch.Tensor:
        """All ``|R|`` canaries, in the alphabet's lexicographic order."""
        secrets = torch.tensor(list(itertools.product(self.alphabet, repeat=self.length)))
        return self._with_prefix(secrets.view(-1, self.length))

    def _with_prefix(self, secrets: torch.Tensor) -> torch.Tensor:
        prefix = torch.tensor(self.prefix, dtype=torch.long).expand(len(secrets), -1)
        return torch.cat([prefix, secrets], dim=1)


@torch.no_grad()
def log_perplexity(
    model: nn.Module, sequences: torch.Tensor, scored_from: int, batch_size: int = 256
) -> torch.Tensor:
    """``-sum log2 p(x_t | x_<t)`` over the positions ``t >= scored_from``, one per sequence.

    ``scored_from`` must be at least 1: the first token has no context to be predicted from.
    """
    if not 1 <= scored_from < sequences.shape[1]:
        raise ValueError(
            f"scored_from must lie in [1, {sequences.shape[1] - 1}] for sequences of "
            f"length {sequences.shape[1]}, got {scored_from}"
        )
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        out = []
        for chunk in sequences.split(batch_size):
            chunk = chunk.to(device)
            logits = model(chunk[:, :-1])
            logp = torch.log_softmax(logits.double(), dim=-1)
            picked = logp.gather(-1, chunk[:, 1:].unsqueeze(-1)).squeeze(-1)
            out.append(-picked[:, scored_from - 1 :].sum(dim=1).cpu() / math.log(2))
        return torch.cat(out)
    finally:
        model.train(was_training)


@torch.no_grad()
def space_log_perplexity(
    model: nn.Module, fmt: CanaryFormat, batch_size: int = 256
) -> torch.Tensor:
    """Every secret's log-perplexity in bits, in :meth:`CanaryFormat.every_secret`'s order.

    One forward pass per ``batch_size`` contexts (see the module); exact for a causal model.
    """
    size, length, start = len(fmt.alphabet), fmt.length, len(fmt.prefix) - 1
    contexts = (
        fmt.every_secret()[::size, :-1]
        if length > 1
        else fmt._with_prefix(torch.zeros(1, 0, dtype=torch.long))
    )
    alphabet = torch.tensor(fmt.alphabet, dtype=torch.long)
    device = next(model.parameters()).device
    # Position k (predicting secret token k) has size**k distinct contexts: every
    # size**(length - 1 - k)-th context row.
    strides = [size ** (length - 1 - k) for k in range(length)]
    picked: list[list[torch.Tensor]] = [[] for _ in range(length)]
    was_training = model.training
    model.eval()
    try:
        for first in range(0, len(contexts), batch_size):
            logits = model(contexts[first : first + batch_size].to(device))
            rows = torch.arange(first, first + len(logits))
            for k, stride in enumerate(strides):
                distinct = rows % stride == 0
                logp = torch.log_softmax(logits[distinct, start + k].double(), dim=-1)
                picked[k].append(logp[:, alphabet.to(device)].cpu())
    finally:
        model.train(was_training)
    secrets = torch.arange(size**length)
    total = torch.zeros(size**length, dtype=torch.float64)
    for k, stride in enumerate(strides):
        # Flattened (context, token) index of secret s at position k: s // stride.
        total -= torch.cat(picked[k]).flatten()[secrets // stride]
    return total / math.log(2)


@dataclass(frozen=True)
class Exposure:
    """One canary's exposure in bits, its rank among ``R`` (estimated where not exact)."""

    value: float
    rank: float
    method: Literal["exact", "skew-normal"]


def exposures(
    model: nn.Module,
    fmt: CanaryFormat,
    secrets: Sequence[Sequence[int]],
    *,
    reference: int,
    generator: torch.Generator,
    exact_limit: int = 100_000,
) -> list[Exposure]:
    """The exposure of each secret's canary under ``model``, against one reference set.

    Every secret of ``R`` is scored when ``|R| <= exact_limit`` (the exact rank); else
    ``reference`` random secrets are scored and a skew-normal is fitted to them.
    """
    scored_from = len(fmt.prefix)
    canaries = torch.stack([fmt.sequence(secret) for secret in secrets])
    canary_ppl = log_perplexity(model, canaries, scored_from).numpy()
    if fmt.space_size <= exact_limit:
        space = space_log_perplexity(model, fmt)
        index = torch.zeros(len(secrets), dtype=torch.long)
        for k in range(fmt.length):  # each secret's place in every_secret()'s order
            digits = canaries[:, scored_from + k, None] == torch.tensor(fmt.alphabet)
            index = index * len(fmt.alphabet) + digits.long().argmax(dim=1)
        # Float32 logits of other batches differ in the last bits; a non-causal model by bits.
        if not np.allclose(space[index].numpy(), canary_ppl, rtol=0.0, atol=1e-3):
            raise ValueError(
                "exact exposure reads the model as causal (a position's logits from the tokens "
                "up to it): this model's log-perplexities of the canaries differ when scored whole"
            )
        space_ppl = np.sort(space.numpy())
        return [_exact(float(p), space_ppl) for p in space[index]]  # each canary as ranked
    if reference < 100:
        raise ValueError(
            f"a skew-normal fit needs at least 100 reference canaries, got {reference}"
        )
    drawn_ppl = log_perplexity(model, fmt.draw(reference, generator), scored_from).numpy()
    shape, loc, scale = _skewnorm().fit(drawn_ppl)
    return [_extrapolated(p, fmt.space_size, (shape, loc, scale)) for p in canary_ppl]


def exposure(
    model: nn.Module,
    fmt: CanaryFormat,
    secret: Sequence[int],
    *,
    reference: int,
    generator: torch.Generator,
    exact_limit: int = 100_000,
) -> Exposure:
    """One secret's exposure (see :func:`exposures`)."""
    return exposures(
        model, fmt, [secret], reference=reference, generator=generator, exact_limit=exact_limit
    )[0]


def _skewnorm() -> Any:
    # Imported when used: clients import this module to plant canaries, and scipy.stats
    # costs each client actor about 1 s.
    from scipy.stats import skewnorm

    return skewnorm


def _exact(canary_ppl: float, sorted_space_ppl: np.ndarray) -> Exposure:
    # The canary is itself in R; the tolerance keeps it from falling out by rounding.
    rank = max(int(np.searchsorted(sorted_space_ppl, canary_ppl + 1e-9, side="right")), 1)
    size = len(sorted_space_ppl)
    return Exposure(math.log2(size) - math.log2(rank), float(rank), "exact")


def _extrapolated(canary_ppl: float, size: int, fit: tuple[float, float, float]) -> Exposure:
    log2_cdf = float(_skewnorm().logcdf(canary_ppl, *fit)) / math.log(2)
    # Rank is at least 1 (the canary itself): exposure never exceeds log2 |R|.
    value = min(-log2_cdf, math.log2(size))
    return Exposure(value, float(2.0 ** (math.log2(size) - value)), "skew-normal")
