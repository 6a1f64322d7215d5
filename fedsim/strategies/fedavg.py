"""FedAvg (McMahan et al. 2017): the example-weighted mean of client models.

Flower's ``FedAvg`` does the aggregation; this subclass adds what every fedsim
strategy needs: seeded sampling by partition id, the global model kept from
``configure_train`` (``aggregate_train`` is not given it), and evaluation of
the global model on the held-out test set. Other strategies subclass it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from fedsim.core import protocol
from fedsim.core.training import evaluate
from fedsim.strategies import STRATEGIES
from fedsim.strategies.base import FedsimStrategy, ServerResources, TooFewReplies, required_replies
from fedsim.strategies.sampling import PartitionSampler

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
            if key in (weight_key, protocol.PARTITION_ID) or not isinstance(value, int | float):
                continue
            totals[key] = totals.get(key, 0.0) + weight * float(value)
    return MetricRecord({k: v / max(weight_sum, 1e-12) for k, v in totals.items()})


@dataclass(frozen=True)
class FedAvgParams:
    """FedAvg has no hyper-parameters beyond the scenario's client config."""


@STRATEGIES.register("fedavg")
class FedAvg(FlowerFedAvg, FedsimStrategy):
    """Flower's FedAvg with fedsim's sampling, bookkeeping and global evaluation.

    A round with fewer replies than ``min_replies`` of the sampled clients
    stops the run (:class:`~fedsim.strategies.base.TooFewReplies`); scenario
    key ``failures.min-replies`` overrides the fraction.
    """

    Params: ClassVar[type] = FedAvgParams
    client_routine: ClassVar[str] = "fedavg"

    def __init__(self, params: Any, sampler: PartitionSampler, server: ServerResources) -> None:
        super().__init__(
            weighted_by_key=protocol.NUM_EXAMPLES,
            train_metrics_aggr_fn=weighted_metrics,
            evaluate_metrics_aggr_fn=weighted_metrics,
        )
        self.params = params
        self.sampler = sampler
        self.server = server
        self.global_arrays: ArrayRecord | None = None
        self.sampled: list[int] = []

    def initial_arrays(self) -> ArrayRecord:
        """The round-0 global model: the zoo model, seeded."""
        return ArrayRecord(self.server.model().state_dict())

    def _messages(
        self, nodes: list[int], arrays: ArrayRecord, config: ConfigRecord, kind: str
    ) -> Iterable[Message]:
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return [Message(content=record, dst_node_id=node, message_type=kind) for node in nodes]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.global_arrays = arrays
        self.sampled = self.sampler.train_partitions(server_round)
        config[protocol.SERVER_ROUND] = server_round
        return self._messages(self.sampler.nodes(self.sampled), arrays, config, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's FedAvg over the replies, once enough of the sampled clients replied."""
        replies = list(replies)
        fraction = self.server.scenario.failures.min_replies or self.min_replies
        needed = required_replies(fraction, len(self.sampled))
        ok = sum(not reply.has_error() for reply in replies)
        if ok < needed:
            raise TooFewReplies(
                f"round {server_round}: {ok} of {len(self.sampled)} sampled clients replied; "
                f"{type(self).__name__} needs {needed} (min-replies {fraction})"
            )
        return super().aggregate_train(server_round, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        partitions = self.sampler.evaluate_partitions(server_round)
        config[protocol.SERVER_ROUND] = server_round
        nodes = self.sampler.nodes(partitions)
        return self._messages(nodes, arrays, config, MessageType.EVALUATE)

    def evaluate_global(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        """Loss and accuracy of the global model on the held-out test set."""
        model = self.server.model(arrays)
        loss, acc = evaluate(model, self.server.bundle.test_images, self.server.bundle.test_labels)
        return {protocol.TEST_LOSS: loss, protocol.TEST_ACC: acc}
