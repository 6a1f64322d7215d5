"""Stragglers as the FedProx paper defines them (Li et al., MLSys 2020, section 5.1).

Systems heterogeneity: each round a share of the sampled clients
(``federation.stragglers``, rounded half up) cannot finish the scenario's
``local-epochs`` E and does a number of epochs drawn uniformly from 1 to E.
The server decides who straggles from ``(seed, round)`` and each straggler's
epochs from ``(seed, round, partition)``, so a repeated or resumed run draws
the same, and sends each straggler its epochs in its train config
(:func:`straggler_config`); the client's routine trains that many. What the
server does with a straggler's partial work is the strategy's
``straggler_replies``: FedAvg drops it, FedProx aggregates it.

Unlike injected failures (:mod:`fedsim.simulation.failures`), a straggler
replies: its work is late in the paper's sense, not lost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedsim.core import protocol
from fedsim.core.seeds import SeedStream, choose, stream_rng

if TYPE_CHECKING:
    from fedsim.core.config import FederationConfig


def straggler_count(fraction: float, sampled: int) -> int:
    """How many of ``sampled`` clients straggle at ``fraction`` (half up: 9 of 10 at 0.9)."""
    return math.floor(fraction * sampled + 0.5)


@dataclass(frozen=True)
class StragglerPlan:
    """Which sampled partitions straggle in a round, and how many epochs each does."""

    seed: int
    fraction: float
    epochs: int  # the scenario's local-epochs, E

    @classmethod
    def of(cls, fed: FederationConfig, epochs: int) -> StragglerPlan | None:
        """The plan of federation ``fed`` whose clients train ``epochs`` local epochs, or
        ``None`` when nobody straggles."""
        if fed.stragglers == 0:
            return None
        return cls(fed.seed, fed.stragglers, epochs)

    def stragglers(self, server_round: int, partitions: Sequence[int]) -> dict[int, int]:
        """Straggling partition -> its epochs (uniform in 1..E) among ``partitions``."""
        count = straggler_count(self.fraction, len(partitions))
        chosen = choose(partitions, count, SeedStream.STRAGGLERS, self.seed, server_round)
        return {partition: self._epochs(server_round, partition) for partition in chosen}

    def _epochs(self, server_round: int, partition: int) -> int:
        # Its own stream per partition: the same whoever else was sampled with it.
        rng = stream_rng(SeedStream.STRAGGLER_EPOCHS, self.seed, server_round, partition)
        return int(rng.integers(1, self.epochs, endpoint=True))


def straggler_config(epochs: int) -> dict[str, int]:
    """The train-config entries that make a client a straggler doing ``epochs`` epochs."""
    return {protocol.STRAGGLER: 1, protocol.LOCAL_EPOCHS: epochs}
