"""FedAvg (McMahan et al. 2017): the example-weighted mean of client models.

Flower's ``FedAvg`` does the aggregation and samples from whatever nodes its
grid offers; this subclass adds what every fedsim strategy needs: the round
number in every message, metrics averaged by example count, stragglers' replies
left out of the aggregate, and the round-0 model from a ``network`` function.
It never asks what runs it: fedsim's loop samples through the grid
(:mod:`fedsim.strategies.sampling`) and evaluates the global model with a
function of its own. Other strategies subclass it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from logging import INFO
from typing import Any, ClassVar, Literal

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from fedsim.core import protocol
from fedsim.strategies.base import FedsimStrategy
from fedsim.strategies.registry import STRATEGIES

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


def _straggled(reply: Message) -> bool | None:
    """Whether a reply's client straggled; ``None`` for an error or a round without stragglers."""
    if reply.has_error():
        return None
    metrics = reply.content.metric_records.get(protocol.METRICS)
    if metrics is None or protocol.STRAGGLER not in metrics:
        return None
    return protocol.read_int(metrics, protocol.STRAGGLER) == 1


@STRATEGIES.register("fedavg")
class FedAvg(FlowerFedAvg, FedsimStrategy):
    """Flower's FedAvg with fedsim's metrics, stragglers and round-0 model.

    ``flower_options`` are Flower's ``FedAvg`` arguments (``fraction_train``,
    ``min_available_nodes``, ...); they sample from the nodes the grid offers.
    ``network`` builds the clients' (untrained, seeded) network on the server:
    the round-0 model (:meth:`initial_arrays`); under Flower's
    ``Strategy.start()`` it may be left out and the initial arrays passed to
    ``start`` instead. A reply that says its client straggled
    (``federation.stragglers``: the train config told it so) is left out of
    the aggregate (as the FedProx paper's FedAvg does) and counted in the
    round's ``stragglers-dropped``; a subclass that keeps them sets
    ``straggler_replies = "aggregate"``.

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
    weighted_mean: ClassVar[bool] = True
    plain_mean: ClassVar[bool] = True

    def __init__(
        self, *, network: Callable[[], torch.nn.Module] | None = None, **flower_options: Any
    ) -> None:
        super().__init__(
            **{
                "weighted_by_key": protocol.NUM_EXAMPLES,
                "train_metrics_aggr_fn": weighted_metrics,
                "evaluate_metrics_aggr_fn": weighted_metrics,
                **flower_options,
            }
        )
        self.params: Any = FedAvgParams()
        self.network_factory = network

    def network(self, arrays: ArrayRecord | None = None) -> torch.nn.Module:
        """The clients' network on the server, loaded with ``arrays`` (may be partial)."""
        if self.network_factory is None:
            raise RuntimeError(
                f"{type(self).__name__} needs network=... (a function building the clients' "
                "untrained network) for a model of its own; under Flower's Strategy.start() "
                "pass initial_arrays instead"
            )
        net = self.network_factory()
        if arrays is not None:
            net.load_state_dict(arrays.to_torch_state_dict(), strict=False)
        return net

    def initial_arrays(self) -> ArrayRecord:
        """The round-0 global model: the shared part of the seeded network."""
        state = self.network().state_dict()
        if self.shared_prefixes is None:
            return ArrayRecord(state)
        return ArrayRecord(protocol.keep_prefixed(state, self.shared_prefixes))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config[protocol.SERVER_ROUND] = server_round
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's FedAvg over the replies, stragglers' left out unless the strategy keeps them.

        In a round with stragglers every reply says whether its client straggled;
        the round's metrics then count the replies left out (``stragglers-dropped``).
        """
        replies = list(replies)
        straggled = [_straggled(reply) for reply in replies]
        if all(flag is None for flag in straggled):  # a round without stragglers
            return super().aggregate_train(server_round, replies)
        dropped = [
            reply
            for reply, flag in zip(replies, straggled, strict=True)
            if flag and self.straggler_replies == "drop"
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
        return super().configure_evaluate(server_round, arrays, config, grid)

    def summary(self) -> None:
        """Flower's banner, and fedsim's hyper-parameters."""
        super().summary()
        log(INFO, "\t└──> fedsim hyper-parameters: %s", self.params)
