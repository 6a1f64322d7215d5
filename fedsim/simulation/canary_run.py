"""A federation under ``[central-dp]`` with user-level canary clients beside its clients.

In process: the real clients' replies come from fedsim's ClientApp (Flower's
``fixedclipping_mod`` inside), the canaries' (:class:`fedsim.audit.canary_clients.CanaryClients`)
join them in Flower's wrapper, which noises the mean of all of them, every client taking
part in every round (the accountant's worst case). ``bench/empirical_privacy.py`` and
``tests/test_canary_clients.py`` measure Andrew et al.'s estimate with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from flwr.app import ConfigRecord, Context, RecordDict

from fedsim.audit.canary_clients import CanaryClients
from fedsim.clients.app import build_client_app
from fedsim.core import protocol
from fedsim.core.config import Scenario, require
from fedsim.core.data import load_dataset
from fedsim.core.empirical_privacy import CosineEstimate
from fedsim.core.training import client_config_record
from fedsim.scenario.components import Components, client_spec
from fedsim.simulation.flower import message_context
from fedsim.simulation.runner import plain_strategy
from fedsim.strategies.base import ServerResources
from fedsim.strategies.central_dp import with_central_dp


@dataclass(frozen=True)
class CanaryRun:
    """What a run with canary clients measured: both epsilons and the model's accuracy."""

    accountant: float
    estimate: CosineEstimate
    test_acc: float


class _Nodes:
    """The node ids Flower's FedAvg samples from: the real clients first, then the canaries."""

    def __init__(self, count: int) -> None:
        self.count = count

    def get_node_ids(self) -> list[int]:
        return list(range(self.count))


def run_with_canary_clients(components: Components, canaries: int) -> CanaryRun:
    """``components`` (a validated scenario with ``[central-dp]``, client-side clipping) run
    in process with ``canaries`` canary clients beside its clients, all in every round."""
    scenario: Scenario = components.scenario
    central, fed = scenario.central_dp, scenario.federation
    require(
        central.clipping == "client",
        "central-dp.clipping",
        central.clipping,
        'canary clients run under client-side clipping: set clipping = "client"',
    )
    server = ServerResources(
        scenario.model, fed.seed, load_dataset(scenario.data), torch.device("cpu")
    )
    population = fed.num_clients + canaries
    inner = plain_strategy(components, server)
    strategy = with_central_dp(inner, central, population, population, fed.seed)
    app = build_client_app(client_spec(scenario), components.strategy.cls.client_routine)
    contexts = {
        node: Context(1, node, {protocol.PARTITION_ID: node}, RecordDict(), {})
        for node in range(fed.num_clients)
    }
    initial = arrays = strategy.initial_arrays()
    planted = CanaryClients(canaries, initial, scenario.audit.seed)
    accountant = float("nan")
    with message_context():
        for server_round in range(1, fed.rounds + 1):
            config = ConfigRecord(client_config_record(scenario.client))
            config[protocol.SERVER_ROUND] = server_round
            nodes = _Nodes(population)  # the one grid call FedAvg makes: its node ids
            sent = strategy.configure_train(server_round, arrays, config, nodes)  # type: ignore[arg-type]
            replies = [
                app(message, contexts[message.metadata.dst_node_id])
                for message in sent
                if message.metadata.dst_node_id < fed.num_clients
            ]
            like = replies[0].content.metric_records[protocol.METRICS]
            replies += planted.replies(arrays, central.clipping_norm, like)
            new, metrics = strategy.aggregate_train(server_round, replies)
            assert new is not None and metrics is not None, "Flower's wrapper released nothing"
            arrays = new
            accountant = float(metrics[protocol.CENTRAL_DP_EPSILON])  # type: ignore[arg-type]
    tested = server.evaluate(fed.rounds, arrays)[protocol.TEST_ACC]
    estimate = planted.estimate(initial, arrays, central.delta)
    return CanaryRun(accountant, estimate, float(tested))  # type: ignore[arg-type]
