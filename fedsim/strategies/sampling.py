"""Seeded client sampling by partition id, through the grid.

Flower's simulation gives nodes random ids, so sampling node ids would pick
different clients on every run. The server maps node ids to partition ids
once (:func:`fedsim.simulation.discovery.discover_partitions`) and samples
partitions from a stream seeded by (seed, round).

As in Flower, sampling is the grid's business, not the strategy's: fedsim's
round loop hands a strategy a :class:`PreselectedGrid` offering only the
round's seeded choice (a strategy built with :data:`TAKE_EVERY_NODE` then asks
all of them), and its :class:`SampledGrid` tells the stragglers their epochs
and checks the failure threshold. The strategy never knows what runs it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecord, Message

from fedsim.core import protocol
from fedsim.core.seeds import SeedStream, choose_below
from fedsim.strategies.base import TooFewReplies, required_replies, with_record
from fedsim.strategies.stragglers import StragglerPlan, straggler_config

# Flower's sampling options that make a strategy ask every node its grid offers.
TAKE_EVERY_NODE: dict[str, Any] = {
    "fraction_train": 1.0,
    "fraction_evaluate": 1.0,
    "min_train_nodes": 0,
    "min_evaluate_nodes": 0,
    "min_available_nodes": 0,
}


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


@dataclass(frozen=True)
class SampledGrid:
    """A Flower ``Grid`` with a run's seeded sampling, stragglers and failure threshold.

    For each phase the round loop takes a view (:meth:`train_view`,
    :meth:`evaluate_view`) and hands it to the strategy, puts the strategy's
    messages in the sampler's order and tells the stragglers (:meth:`outgoing`),
    and checks the training replies (:meth:`check_replies`). ``min_replies``: a
    round needs at least this fraction of its sampled clients to reply.
    """

    grid: Any
    sampler: PartitionSampler
    min_replies: float
    stragglers: StragglerPlan | None = None

    @property
    def partition_of(self) -> dict[int, int]:
        return self.sampler.partition_of

    def train_view(self, server_round: int) -> PreselectedGrid:
        partitions = self.sampler.train_partitions(server_round)
        return PreselectedGrid(self.grid, self.sampler.nodes(partitions))

    def evaluate_view(self, server_round: int) -> PreselectedGrid:
        partitions = self.sampler.evaluate_partitions(server_round)
        return PreselectedGrid(self.grid, self.sampler.nodes(partitions))

    def outgoing(
        self, server_round: int, view: PreselectedGrid, messages: Iterable[Message], train: bool
    ) -> list[Message]:
        """``messages`` in the sampler's order (Flower shuffles what it samples); with
        stragglers, each train message says whether its client straggles, and a
        straggler's carries its own smaller ``local-epochs`` (clients.csv records both)."""
        order = {node: i for i, node in enumerate(view.get_node_ids())}
        ordered = sorted(messages, key=lambda m: order[m.metadata.dst_node_id])
        if not train or self.stragglers is None:
            return ordered
        partitions = [self.partition_of[m.metadata.dst_node_id] for m in ordered]
        straggling = self.stragglers.stragglers(server_round, partitions)
        return [
            self._told(message, straggling.get(partition))
            for message, partition in zip(ordered, partitions, strict=True)
        ]

    @staticmethod
    def _told(message: Message, epochs: int | None) -> Message:
        told = straggler_config(epochs) if epochs else {protocol.STRAGGLER: 0}
        config = message.content.config_records[protocol.CONFIG]
        return with_record(message, protocol.CONFIG, ConfigRecord({**config, **told}))

    def check_replies(self, server_round: int, sampled: int, replies: list[Message]) -> None:
        """Raise :class:`TooFewReplies` when fewer than ``min_replies`` of the sampled replied."""
        needed = required_replies(self.min_replies, sampled)
        ok = sum(not reply.has_error() for reply in replies)
        if ok < needed:
            raise TooFewReplies(
                f"round {server_round}: {ok} of {sampled} sampled clients replied; "
                f"the strategy needs {needed} (min-replies {self.min_replies})"
            )
