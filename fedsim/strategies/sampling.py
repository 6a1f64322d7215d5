"""Seeded client sampling by partition id.

Flower's simulation gives nodes random ids, so sampling node ids would pick
different clients on every run. The server maps node ids to partition ids
once and samples partitions from a generator seeded by (seed, round).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedsim.core import protocol
from fedsim.core.seeds import SeedStream, choose


def _wait_for_nodes(grid: Grid, expected: int | None, wait_s: float) -> list[int]:
    # run_simulation starts the ServerApp before it registers the simulated
    # nodes; with many clients the first look sees only some of them.
    deadline = time.monotonic() + wait_s
    while True:
        nodes = sorted(grid.get_node_ids())
        if expected is None or len(nodes) >= expected:
            return nodes
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {len(nodes)} of {expected} simulated clients connected in {wait_s:.0f}s"
            )
        time.sleep(0.05)


def _registration_order(grid: Grid, nodes: list[int]) -> dict[int, int] | None:
    """Partition -> node from the order the simulation registered its nodes.

    Flower's simulation registers partition ``i`` as the ``i``-th node of its
    in-memory link state (flwr 1.42, ``vce_api._register_nodes``). Reading that
    order replaces one query message per node (54 s for 1,000 clients on two
    cores); every reply names its partition and the round loop checks it
    against this map, so a change in Flower fails loudly. ``None`` on other grids.
    """
    registered = getattr(getattr(grid, "state", None), "nodes", None)
    if not isinstance(registered, dict) or set(registered) != set(nodes):
        return None
    return {partition: int(node) for partition, node in enumerate(registered)}


def _query_partitions(grid: Grid, nodes: list[int]) -> dict[int, int]:
    """Partition -> node by asking every node (a ``query`` message each)."""
    queries = [
        Message(content=RecordDict(), message_type=MessageType.QUERY, dst_node_id=node)
        for node in nodes
    ]
    mapping: dict[int, int] = {}
    for reply in grid.send_and_receive(queries):
        if reply.has_error():
            raise RuntimeError(f"node {reply.metadata.src_node_id} failed discovery")
        partition = int(reply.content[protocol.METRICS][protocol.PARTITION_ID])  # type: ignore[arg-type]
        mapping[partition] = reply.metadata.src_node_id
    return mapping


@dataclass(frozen=True)
class PartitionSampler:
    """Which partitions train or evaluate in a round, as node ids."""

    node_of_partition: dict[int, int]
    seed: int
    per_round: int
    evaluate_fraction: float = 1.0

    @classmethod
    def discover(
        cls,
        grid: Grid,
        seed: int,
        per_round: int,
        evaluate_fraction: float = 1.0,
        *,
        expected: int | None = None,
        probes: int = 0,
        wait_s: float = 300.0,
    ) -> PartitionSampler:
        """Map every connected node (at least ``expected`` of them) to its partition id.

        When the map comes from the registration order, ``probes`` nodes spread
        over the partitions are queried all the same: their answers check the
        map early, and the queries warm the simulation's actors (imports, data)
        before the first round's reply deadline starts.
        """
        nodes = _wait_for_nodes(grid, expected, wait_s)
        mapping = _registration_order(grid, nodes)
        if mapping is None:
            return cls(_query_partitions(grid, nodes), seed, per_round, evaluate_fraction)
        spread = np.linspace(0, len(mapping) - 1, min(probes, len(mapping))).round()
        answered = _query_partitions(grid, sorted({mapping[int(p)] for p in spread}))
        wrong = [p for p, node in answered.items() if mapping.get(p) != node]
        if wrong:
            raise RuntimeError(
                f"partition {wrong[0]} answered from node {answered[wrong[0]]}, not from the "
                "node registered for it: Flower's simulation no longer registers "
                "partitions in order"
            )
        return cls(mapping, seed, per_round, evaluate_fraction)

    @property
    def num_clients(self) -> int:
        return len(self.node_of_partition)

    @functools.cached_property
    def partition_of(self) -> dict[int, int]:
        """Node id -> partition id."""
        return {node: partition for partition, node in self.node_of_partition.items()}

    def train_partitions(self, server_round: int) -> list[int]:
        return choose(
            self.node_of_partition, self.per_round, SeedStream.SAMPLE_TRAIN, self.seed, server_round
        )

    def evaluate_partitions(self, server_round: int) -> list[int]:
        count = round(self.evaluate_fraction * self.num_clients)
        stream = SeedStream.SAMPLE_EVALUATE
        return choose(self.node_of_partition, count, stream, self.seed, server_round)

    def nodes(self, partitions: list[int]) -> list[int]:
        return [self.node_of_partition[p] for p in partitions]
