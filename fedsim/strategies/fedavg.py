"""FedAvg (McMahan et al. 2017): the example-weighted mean of client models.

Flower's ``FedAvg`` does the aggregation and, on its own, the sampling; this
subclass adds what every fedsim strategy needs: the round number in every
message, metrics averaged by example count, and with fedsim's engine attached
seeded sampling by partition id, a failure threshold and evaluation of the
global model on the held-out test set. Other strategies subclass it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO
from typing import Any, ClassVar, Literal, Self

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from fedsim.core import protocol
from fedsim.core.training import evaluate
from fedsim.strategies.base import (
    EngineServices,
    FedsimStrategy,
    TooFewReplies,
    required_replies,
    with_record,
)
from fedsim.strategies.registry import STRATEGIES
from fedsim.strategies.sampling import PreselectedGrid
from fedsim.strategies.stragglers import straggler_config

NUM_EXAMPLES = protocol.NUM_EXAMPLES


def weighted_metrics(records: list[RecordDict], weight_key: str) -> MetricRecord:
    """Example-weighted mean of every reply metric except ids and counts."""
    totals: dict[str, float] = {}
    weight_sum = 0.0
    for record in records:
        metrics = record[protocol.METRICS]
        weight = protocol.read_float(metrics, weight_key)
        weight_sum += weight
        for key, value in metrics.items():
            if (
                key == weight_key
                or key in protocol.PER_CLIENT_METRICS
                or not isinstance(value, int | float)
            ):
                continue
            totals[key] = totals.get(key, 0.0) + weight * float(value)
    return MetricRecord({k: v / max(weight_sum, 1e-12) for k, v in totals.items()})


@dataclass(frozen=True)
class FedAvgParams:
    """FedAvg has no hyper-parameters beyond the scenario's client config."""


@STRATEGIES.register("fedavg")
class FedAvg(FlowerFedAvg, FedsimStrategy):
    """Flower's FedAvg with fedsim's metrics, and the engine's services when attached.

    ``flower_options`` are Flower's ``FedAvg`` arguments (``fraction_train``,
    ``min_available_nodes``, ...); they govern sampling under Flower's
    ``Strategy.start()``. With the engine attached, the scenario's seeded
    partition sampling replaces them, and a round with fewer replies than
    ``min_replies`` of the sampled clients stops the run
    (:class:`~fedsim.strategies.base.TooFewReplies`); scenario key
    ``failures.min-replies`` overrides the fraction. With stragglers
    (``federation.stragglers``) the engine's plan picks them among the sampled
    clients and their messages carry their smaller ``local-epochs``; FedAvg
    drops their replies from the aggregate (as the FedProx paper's FedAvg
    does) and counts them in the round's ``stragglers-dropped``; a subclass
    that keeps them sets ``straggler_replies = "aggregate"``.

    Message contract (keys in :mod:`fedsim.core.protocol`): train and evaluate
    messages carry the global model (``arrays``) and ``config`` with the
    public client settings and ``server-round``. A train reply carries the
    client's model (``arrays``) and ``metrics`` with ``num-examples`` (the
    aggregation weight) and ``partition-id``; an evaluate reply ``metrics``
    with ``num-examples``, ``eval-loss``, ``eval-acc`` and ``partition-id``.
    """

    Params: ClassVar[type] = FedAvgParams
    client_routine: ClassVar[str] = "fedavg"
    straggler_replies: ClassVar[Literal["drop", "aggregate"] | None] = "drop"

    def __init__(self, **flower_options: Any) -> None:
        super().__init__(
            **{
                "weighted_by_key": protocol.NUM_EXAMPLES,
                "train_metrics_aggr_fn": weighted_metrics,
                "evaluate_metrics_aggr_fn": weighted_metrics,
                **flower_options,
            }
        )
        self.params: Any = FedAvgParams()
        self.sampled: list[int] = []
        self.straggling: dict[int, int] = {}  # this round's stragglers: partition -> epochs

    def initial_arrays(self) -> ArrayRecord:
        """The round-0 global model: the zoo model, seeded."""
        return ArrayRecord(self.require_engine("initial_arrays").server.model().state_dict())

    def attach_engine(self, engine: EngineServices) -> Self:
        """As :meth:`FedsimStrategy.attach_engine`; the engine's sampler decides who is asked."""
        # Flower's sampling then takes every node the engine's preselected grid offers.
        self.fraction_train = self.fraction_evaluate = 1.0
        self.min_train_nodes = self.min_evaluate_nodes = self.min_available_nodes = 0
        return super().attach_engine(engine)

    def _ask(self, nodes: list[int], messages: Iterable[Message]) -> list[Message]:
        # Flower shuffles the nodes it samples; send in the sampler's order.
        order = {node: i for i, node in enumerate(nodes)}
        return sorted(messages, key=lambda m: order[m.metadata.dst_node_id])

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config[protocol.SERVER_ROUND] = server_round
        if self.engine is None:
            messages = list(super().configure_train(server_round, arrays, config, grid))
            self.sampled = [m.metadata.dst_node_id for m in messages]
            return messages
        sampler, plan = self.engine.sampler, self.engine.stragglers
        self.sampled = sampler.train_partitions(server_round)
        nodes = sampler.nodes(self.sampled)
        chosen = PreselectedGrid(grid, nodes)
        messages = self._ask(nodes, super().configure_train(server_round, arrays, config, chosen))  # type: ignore[arg-type]
        self.straggling = plan.stragglers(server_round, self.sampled) if plan else {}
        return [self._told_epochs(message, config) for message in messages]

    def _told_epochs(self, message: Message, config: ConfigRecord) -> Message:
        # With stragglers every train message says whether its client straggles, and a
        # straggler's carries its own smaller local-epochs: clients.csv records both.
        if self.require_engine("stragglers").stragglers is None:
            return message
        partition = self.require_engine("stragglers").sampler.partition_of[
            message.metadata.dst_node_id
        ]
        epochs = self.straggling.get(partition)
        told = straggler_config(epochs) if epochs else {protocol.STRAGGLER: 0}
        return with_record(message, protocol.CONFIG, ConfigRecord({**config, **told}))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's FedAvg over the replies, once enough of the sampled clients replied.

        A straggler's reply counts as a reply; FedAvg then leaves it out of the
        aggregate and records how many it left out (``stragglers-dropped``).
        """
        replies = list(replies)
        fraction = (self.engine and self.engine.min_replies) or self.min_replies
        needed = required_replies(fraction, len(self.sampled))
        ok = sum(not reply.has_error() for reply in replies)
        if self.engine is not None and ok < needed:
            raise TooFewReplies(
                f"round {server_round}: {ok} of {len(self.sampled)} sampled clients replied; "
                f"{type(self).__name__} needs {needed} (min-replies {fraction})"
            )
        if self.engine is None or self.engine.stragglers is None:
            return super().aggregate_train(server_round, replies)
        partition_of = self.engine.sampler.partition_of
        dropped = [
            reply
            for reply in replies
            if self.straggler_replies == "drop"
            and not reply.has_error()
            and partition_of[reply.metadata.src_node_id] in self.straggling
        ]
        kept = [reply for reply in replies if reply not in dropped]
        arrays, metrics = super().aggregate_train(server_round, kept)
        metrics = metrics if metrics is not None else MetricRecord()
        metrics[protocol.STRAGGLERS_DROPPED] = len(dropped)
        return arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config[protocol.SERVER_ROUND] = server_round
        if self.engine is None:
            return super().configure_evaluate(server_round, arrays, config, grid)
        sampler = self.engine.sampler
        nodes = sampler.nodes(sampler.evaluate_partitions(server_round))
        chosen = PreselectedGrid(grid, nodes)
        return self._ask(nodes, super().configure_evaluate(server_round, arrays, config, chosen))  # type: ignore[arg-type]

    def evaluate_global(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        """Loss and accuracy of the global model on the held-out test set (engine only)."""
        if self.engine is None:
            return None
        server = self.engine.server
        test_images, test_labels = server.bundle.test_images, server.bundle.test_labels
        loss, acc = evaluate(server.model(arrays), test_images, test_labels)
        return {protocol.TEST_LOSS: loss, protocol.TEST_ACC: acc}

    def summary(self) -> None:
        """Flower's banner, telling the sampling that really happens."""
        if self.engine is None:
            super().summary()
            return
        sampler = self.engine.sampler
        log(INFO, "\t├──> Sampling (fedsim, seeded by partition id; seed %d):", sampler.seed)
        log(
            INFO,
            "\t│\t├──train: %d of %d clients per round",
            sampler.per_round,
            sampler.num_clients,
        )
        log(
            INFO,
            "\t│\t└──evaluate: %d of %d clients per round",
            len(sampler.evaluate_partitions(1)),
            sampler.num_clients,
        )
        log(INFO, "\t├──> Hyper-parameters: %s", self.params)
        log(INFO, "\t└──> Keys in records:")
        log(INFO, "\t\t├── Weighted by: '%s'", self.weighted_by_key)
        log(INFO, "\t\t├── ArrayRecord key: '%s'", self.arrayrecord_key)
        log(INFO, "\t\t└── ConfigRecord key: '%s'", self.configrecord_key)
