"""Seeded client sampling by partition id.

Flower's simulation gives nodes random ids, so sampling node ids would pick
different clients on every run. The server asks each node its partition id
once (a ``query`` message) and samples partitions from a seeded generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid


@dataclass(frozen=True)
class PartitionSampler:
    """Which partitions train or evaluate in a round, as node ids."""

    node_of_partition: dict[int, int]
    seed: int
    per_round: int
    evaluate_fraction: float = 1.0

    @classmethod
    def discover(
        cls, grid: Grid, seed: int, per_round: int, evaluate_fraction: float = 1.0
    ) -> PartitionSampler:
        """Ask every connected node for its partition id."""
        from clients.app import PARTITION_KEY

        nodes = sorted(grid.get_node_ids())
        queries = [
            Message(content=RecordDict(), message_type=MessageType.QUERY, dst_node_id=node)
            for node in nodes
        ]
        mapping: dict[int, int] = {}
        for reply in grid.send_and_receive(queries):
            if reply.has_error():
                raise RuntimeError(f"node {reply.metadata.src_node_id} failed discovery")
            partition = int(reply.content["metrics"][PARTITION_KEY])  # type: ignore[arg-type]
            mapping[partition] = reply.metadata.src_node_id
        return cls(mapping, seed, per_round, evaluate_fraction)

    @property
    def num_clients(self) -> int:
        return len(self.node_of_partition)

    def _choose(self, count: int, *stream: int) -> list[int]:
        if count >= self.num_clients:
            return sorted(self.node_of_partition)
        rng = np.random.default_rng([self.seed, *stream])
        return sorted(int(p) for p in rng.choice(sorted(self.node_of_partition), count, False))

    def train_partitions(self, server_round: int) -> list[int]:
        return self._choose(self.per_round, 3, server_round)

    def evaluate_partitions(self, server_round: int) -> list[int]:
        count = round(self.evaluate_fraction * self.num_clients)
        return self._choose(count, 4, server_round) if count else []

    def nodes(self, partitions: list[int]) -> list[int]:
        return [self.node_of_partition[p] for p in partitions]
