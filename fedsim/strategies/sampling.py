"""Seeded client sampling by partition id.

Flower's simulation gives nodes random ids, so sampling node ids would pick
different clients on every run. The server maps node ids to partition ids
once (:func:`fedsim.simulation.discovery.discover_partitions`) and samples
partitions from a stream seeded by (seed, round).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from fedsim.core.seeds import SeedStream, choose_below


@dataclass(frozen=True)
class PartitionSampler:
    """Which partitions train or evaluate in a round, as node ids.

    Partitions are ``0 .. num_clients - 1`` (discovery maps every one), so a
    round's draw never lists the population.
    """

    node_of_partition: dict[int, int]
    seed: int
    per_round: int
    evaluate_per_round: int | None = None  # None: every client

    @property
    def num_clients(self) -> int:
        return len(self.node_of_partition)

    @functools.cached_property
    def partition_of(self) -> dict[int, int]:
        """Node id -> partition id."""
        return {node: partition for partition, node in self.node_of_partition.items()}

    def train_partitions(self, server_round: int) -> list[int]:
        stream = SeedStream.SAMPLE_TRAIN
        return choose_below(self.num_clients, self.per_round, stream, self.seed, server_round)

    def evaluate_partitions(self, server_round: int) -> list[int]:
        count = self.num_clients if self.evaluate_per_round is None else self.evaluate_per_round
        stream = SeedStream.SAMPLE_EVALUATE
        return choose_below(self.num_clients, count, stream, self.seed, server_round)

    def nodes(self, partitions: list[int]) -> list[int]:
        return [self.node_of_partition[p] for p in partitions]


class PreselectedGrid:
    """A view of a ``Grid`` that offers only the nodes the engine sampled.

    Flower's strategies sample from ``grid.get_node_ids()``; handed this view
    (and sampling every node offered), any of them sends to exactly the
    engine's seeded choice, and keeps its own ``configure_*`` bookkeeping
    (FedOpt remembers the model it sent). Everything else goes to the grid.
    """

    def __init__(self, grid: Any, nodes: list[int]) -> None:
        self._grid = grid
        self._nodes = list(nodes)

    def get_node_ids(self) -> list[int]:
        return list(self._nodes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)
