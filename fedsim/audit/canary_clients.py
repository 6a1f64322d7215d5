"""User-level canary clients (Andrew et al., ICLR 2024: one-shot empirical privacy estimation).

Each canary client has a random direction (uniform on the unit sphere of the uploaded
parameters) and, every round it takes part, uploads the sent model moved by the clipping
norm along it: an update that clipping leaves unchanged, and the largest it allows. As many
directions again are drawn and never inserted. After the run, the cosines between the final
model's change and each direction, inserted and unseen, give the estimate
(:func:`fedsim.core.empirical_privacy.cosine_epsilon`). The auditor designs the canaries
(the ``audit-canary-clients`` stream); nothing here reads a real client's data.

:func:`run_with_canary_clients` runs a scenario under ``[central-dp]`` with canary clients
in process: the real clients' replies come from fedsim's ClientApp (Flower's
``fixedclipping_mod`` inside), the canaries' join them in Flower's wrapper, which noises
the mean of all of them, every client taking part in every round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedsim.clients.app import build_client_app
from fedsim.core import protocol
from fedsim.core.config import Scenario, require
from fedsim.core.data import load_dataset
from fedsim.core.empirical_privacy import CosineEstimate, cosine_epsilon
from fedsim.core.seeds import SeedStream, stream_rng
from fedsim.core.training import client_config_record
from fedsim.scenario.components import Components, client_spec
from fedsim.simulation.flower import message_context
from fedsim.strategies.base import ServerResources
from fedsim.strategies.central_dp import with_central_dp
from fedsim.strategies.sampling import TAKE_EVERY_NODE


def _flat(record: ArrayRecord) -> np.ndarray:
    return np.concatenate([a.numpy().ravel().astype(np.float64) for a in record.values()])


@dataclass
class CanaryClients:
    """``inserted`` canary clients and as many unseen directions, over ``template``'s arrays."""

    inserted: int
    template: ArrayRecord
    seed: int

    def __post_init__(self) -> None:
        require(self.inserted >= 2, "canary-clients", self.inserted, "must be >= 2")
        size = sum(a.numpy().size for a in self.template.values())
        rng = stream_rng(SeedStream.AUDIT_CANARY_CLIENTS, self.seed)
        directions = rng.standard_normal((2 * self.inserted, size), dtype=np.float32)
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        self.directions = directions  # the first ``inserted`` rows go in

    def replies(self, sent: ArrayRecord, clipping_norm: float, like: MetricRecord) -> list[Message]:
        """Every inserted canary's train reply to ``sent``, its metrics a copy of a real
        reply's ``like`` (Flower's FedAvg aggregates only replies with the same keys, and
        weighs them by its example count) under a partition id of its own (-1, -2, ...)."""
        base = _flat(sent)
        replies = []
        for index in range(self.inserted):
            moved = base + clipping_norm * self.directions[index].astype(np.float64)
            arrays, start = {}, 0
            for name, array in sent.items():
                values = array.numpy()
                part = moved[start : start + values.size].reshape(values.shape)
                arrays[name] = Array(part.astype(values.dtype))
                start += values.size
            metrics = MetricRecord(dict(like))
            metrics[protocol.PARTITION_ID] = -1 - index
            content = RecordDict({protocol.ARRAYS: ArrayRecord(arrays), protocol.METRICS: metrics})
            replies.append(Message(content, dst_node_id=0, message_type="train"))
        return replies

    def estimate(self, initial: ArrayRecord, final: ArrayRecord, delta: float) -> CosineEstimate:
        """The estimate from the model's change over the run (the auditor's bootstrap)."""
        change = _flat(final) - _flat(initial)
        cosines = self.directions.astype(np.float64) @ change / np.linalg.norm(change)
        rng = stream_rng(SeedStream.AUDIT_BOOTSTRAP, self.seed, 0)
        return cosine_epsilon(cosines[: self.inserted], cosines[self.inserted :], delta, rng)


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
    cls = components.strategy.cls
    inner = cls.from_params(
        components.strategy.params, **TAKE_EVERY_NODE, **cls.server_arguments(server)
    )
    population = fed.num_clients + canaries
    strategy = with_central_dp(inner, central, population, population, fed.seed)
    app = build_client_app(client_spec(scenario), cls.client_routine)
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
