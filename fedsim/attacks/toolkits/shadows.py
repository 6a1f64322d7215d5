"""Shadow clients and the round's other clients: what calibrated leak analyses share.

An honest-but-curious server knows the round's client configuration (it sends it),
holds public labelled data and receives every client of the round. Two kinds of
reference follow, both used by ``shadow-labels`` (:mod:`fedsim.attacks.leaks.shadow_labels`)
and the calibrated membership scores (:mod:`fedsim.attacks.leaks.membership_reference`):

- *shadow clients*: public subsets trained from the sent model with the client's own
  routine (:func:`train_shadow`, at the round's client sizes: :func:`shadow_sizes`), built
  once per round for all of its clients;
- *the round's other clients*: a leak analysis receives a round's clients in one
  :meth:`~fedsim.attacks.leakage.LeakAnalysis.analyse_many` call (a
  :class:`RoundAnalysis` reads it round by round), so each client can be read against
  the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

import numpy as np
import torch

from fedsim.attacks.leakage import Leak, LeakAnalysis, LeakInput
from fedsim.core.config import ClientConfig
from fedsim.core.seeds import SeedStream, derive_seed
from fedsim.core.training import train_local

L = TypeVar("L", bound=Leak)  # the leak kind an analysis returns


class RoundAnalysis(LeakAnalysis, Generic[L]):
    """A leak analysis that reads one round's clients together (they share the sent
    model): :meth:`read_round` gets each round's inputs at once, one client alone is a
    round of one."""

    def analyse(self, inputs: LeakInput, seed: int = 0) -> L:
        """One client, read as a round of one."""
        (leak,) = self.read_round([inputs], seed)
        return leak

    def analyse_many(self, inputs: Sequence[LeakInput], seed: int = 0) -> list[Leak]:
        """:meth:`read_round` applied to each round's inputs (those of one sent model)
        together, the results back in ``inputs``' order."""
        by_round: dict[int, list[int]] = {}
        for i, one in enumerate(inputs):
            by_round.setdefault(one.observation.round, []).append(i)
        out: dict[int, Leak] = {}
        for indices in by_round.values():
            results = self.read_round([inputs[i] for i in indices], seed)
            out.update(zip(indices, results, strict=True))
        return [out[i] for i in range(len(inputs))]

    def read_round(self, inputs: Sequence[LeakInput], seed: int) -> Sequence[L]:
        """One leak for each of one round's clients."""
        raise NotImplementedError


def round_rng(seed: int, server_round: int) -> np.random.Generator:
    """The attacker-side generator of one round's shadow pool."""
    return np.random.default_rng([derive_seed(SeedStream.LEAK_ANALYSIS, seed), server_round])


def shadow_sizes(sizes: Sequence[int], shadows: int, cap: int = 0) -> list[int]:
    """``shadows`` client sizes spread over the quantiles of the round's ``sizes``
    (at most ``cap`` examples each where ``cap`` > 0)."""
    quantiles = np.quantile(np.asarray(sizes, dtype=float), (np.arange(shadows) + 0.5) / shadows)
    made = [int(max(1, round(q))) for q in quantiles]
    return [min(size, cap) for size in made] if cap else made


def train_shadow(
    model: torch.nn.Module,
    sent: dict[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    config: ClientConfig,
    seed: int,
) -> dict[str, torch.Tensor]:
    """One shadow client: ``model`` reset to the ``sent`` parameters, trained on
    ``images``/``labels`` with the clients' routine (:func:`train_local`, ``config``);
    its trained parameters (``model`` is left in eval mode, trained)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(sent[name])
    train_local(model, images, labels, config, seed)
    model.eval()
    return {n: q.detach().clone() for n, q in model.named_parameters()}
