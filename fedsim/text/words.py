"""Which tokens a client used, read from its update's token-embedding rows (Melis et al. 2019).

A token's embedding row gets a gradient only from the positions that hold the
token, so a row that moved in a client's update names a token the client fed
its model this round, at any client size. Weight decay (and FedProx's proximal
term) move every row, but every unused row the same, data-free way: the server
replays the client's public optimiser (``client`` config: optimiser, lr,
momentum, weight decay; the step count from the reported examples) on the sent
rows with no data gradient, and calls a row used when the client's differs from
that replay. An optimiser state kept across rounds (momentum carried over) moves
unused rows the replay cannot know: the analysis assumes a fresh optimiser each
round, as fedsim's clients have unless told to keep it.

The frequency prior is the baseline a server without the update has: the ``k``
most frequent tokens of its public text, ``k`` the size of the update's estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedsim.core.config import ClientConfig
from fedsim.core.training import make_optimizer

RELATIVE_TOLERANCE = 1e-5
"""A row moved when it differs from its data-free replay by more than this share of its
largest entry (float32 rounding of identical arithmetic is far below it)."""


def local_steps(examples: int, cfg: ClientConfig) -> int:
    """How many optimiser steps a client of ``examples`` takes (public: its config)."""
    return cfg.local_steps or cfg.local_epochs * math.ceil(examples / cfg.batch_size)


def data_free(rows: torch.Tensor, cfg: ClientConfig, steps: int, mu: float) -> torch.Tensor:
    """``rows`` after ``steps`` steps of ``cfg``'s optimiser with no data gradient: weight
    decay and FedProx's proximal term (``mu``) only; the rows themselves without either."""
    if cfg.weight_decay == 0 and mu == 0:
        return rows
    start = rows.detach().clone()
    weights = start.clone().requires_grad_(True)
    optimizer = make_optimizer([weights], cfg)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=False)
        weights.grad = mu * (weights.detach() - start)
        optimizer.step()
    return weights.detach()


def used_tokens(
    sent: torch.Tensor, received: torch.Tensor, cfg: ClientConfig, examples: int, mu: float = 0.0
) -> torch.Tensor:
    """The ids of the embedding rows (``(V, d)`` as sent and as received) the client's data
    moved, sorted."""
    expected = data_free(sent.float(), cfg, local_steps(examples, cfg), mu)
    scale = received.float().abs().amax(dim=1).clamp_min(1e-12)
    moved = (received.float() - expected).abs().amax(dim=1) > RELATIVE_TOLERANCE * scale
    return torch.nonzero(moved).flatten()


def frequency_prior(public: torch.Tensor, size: int, vocabulary: int) -> torch.Tensor:
    """The ``size`` most frequent token ids of the public windows ``public``."""
    counts = torch.bincount(public.flatten(), minlength=vocabulary)
    return torch.sort(torch.argsort(counts, descending=True, stable=True)[:size]).values


@dataclass(frozen=True)
class WordScore:
    """Precision, recall and F1 of an estimated token set against the true one."""

    precision: float
    recall: float
    f1: float


def score_tokens(estimate: torch.Tensor, truth: torch.Tensor) -> WordScore:
    """The estimate's precision, recall and F1 against the tokens ``truth`` (ids)."""
    found, real = set(estimate.tolist()), set(truth.tolist())
    hits = len(found & real)
    precision = hits / len(found) if found else 0.0
    recall = hits / len(real) if real else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return WordScore(precision, recall, f1)


def input_tokens(windows: torch.Tensor) -> torch.Tensor:
    """The token ids a model read from ``windows`` ``(N, T + 1)``: all but each last one."""
    return torch.unique(windows[:, :-1])
