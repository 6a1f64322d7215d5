"""A federation under ``[central-dp]`` with user-level canary clients beside its clients.

In process: the real clients' replies come from fedsim's ClientApp (Flower's
``fixedclipping_mod`` inside), the canaries' join them in Flower's wrapper
(:class:`fedsim.audit.canary_clients.WithCanaryClients`, as in a run with
``audit.canary-clients``), which noises the mean of all of them, every client taking part
in every round (the accountant's worst case). ``bench/empirical_privacy.py`` and
``tests/test_canary_clients.py`` measure Andrew et al.'s estimate with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from flwr.app import ConfigRecord, Context, RecordDict

from fedsim.audit.canary_clients import WithCanaryClients
from fedsim.clients.app import build_client_app
from fedsim.core import protocol
from fedsim.core.config import require
from fedsim.core.data import load_dataset
from fedsim.core.empirical_privacy import CosineEstimate
from fedsim.core.training import client_config_record
from fedsim.scenario.components import Components, client_spec
from fedsim.simulation.flower import message_context
from fedsim.simulation.runner import plain_strategy, with_central_dp_and_canaries
from fedsim.strategies.base import ServerResources


@dataclass(frozen=True)
class CanaryRun:
    """What a run with canary clients measured: both epsilons and the model's accuracy."""

    accountant: float
    estimate: CosineEstimate
    test_acc: float


class _Nodes:
    """The node ids Flower's FedAvg samples from: every client's."""

    def __init__(self, count: int) -> None:
        self.count = count

    def get_node_ids(self) -> list[int]:
        return list(range(self.count))


def run_with_canary_clients(components: Components, canaries: int) -> CanaryRun:
    """``components`` (a validated scenario with ``[central-dp]``, client-side clipping,
    every client sampled) run in process with ``canaries`` canary clients beside its
    clients, all in every round."""
    scenario = components.scenario
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
    inner = plain_strategy(components, server)
    strategy = with_central_dp_and_canaries(
        inner, scenario.central_dp, scenario.federation, canaries, scenario.audit.seed
    )
    assert isinstance(strategy, WithCanaryClients)
    app = build_client_app(client_spec(scenario), components.strategy.cls.client_routine)
    contexts = {
        node: Context(1, node, {protocol.PARTITION_ID: node}, RecordDict(), {})
        for node in range(fed.num_clients)
    }
    arrays = strategy.initial_arrays()
    accountant = float("nan")
    with message_context():
        for server_round in range(1, fed.rounds + 1):
            config = ConfigRecord(client_config_record(scenario.client))
            config[protocol.SERVER_ROUND] = server_round
            nodes = _Nodes(fed.num_clients)  # the one grid call FedAvg makes: its node ids
            sent = strategy.configure_train(server_round, arrays, config, nodes)  # type: ignore[arg-type]
            replies = [app(message, contexts[message.metadata.dst_node_id]) for message in sent]
            new, metrics = strategy.aggregate_train(server_round, replies)
            assert new is not None and metrics is not None, "Flower's wrapper released nothing"
            arrays = new
            accountant = float(metrics[protocol.CENTRAL_DP_EPSILON])  # type: ignore[arg-type]
    tested = server.evaluate(fed.rounds, arrays)[protocol.TEST_ACC]
    assert strategy.estimate is not None
    return CanaryRun(accountant, strategy.estimate, float(tested))  # type: ignore[arg-type]
