"""FedProx: mu = 0 is FedAvg exactly; mu > 0 keeps clients near the global model."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from inprocess import run_inprocess, tiny_table

from fedsim.clients.base import ClientEnv
from fedsim.clients.fedprox import FedProxClient
from fedsim.core import protocol
from fedsim.core.config import Scenario
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.training import client_config_record
from fedsim.scenario.components import client_spec


def _scenario(strategy: dict[str, Any]) -> Scenario:
    return scenario_from_dict(tiny_table(strategy, federation={"num-clients": 2}))


def test_mu_zero_gives_fedavg_exactly() -> None:
    fedavg = run_inprocess(_scenario({"name": "fedavg"}))
    fedprox = run_inprocess(_scenario({"name": "fedprox", "proximal-mu": 0.0}))

    assert list(fedavg.final_arrays.keys()) == list(fedprox.final_arrays.keys())
    for key in fedavg.final_arrays:
        np.testing.assert_array_equal(
            fedavg.final_arrays[key].numpy(), fedprox.final_arrays[key].numpy()
        )
    assert [r.train for r in fedavg.records] == [r.train for r in fedprox.records]
    sent = [m.content["config"] for m in fedprox.grid.sent if m.metadata.message_type == "train"]
    assert sent and all(config[protocol.PROXIMAL_MU] == 0.0 for config in sent)


def _distance_from_global(env: ClientEnv, mu: float) -> float:
    global_model = env.model()
    train = _scenario({"name": "fedprox"}).client
    config = ConfigRecord(
        {**client_config_record(train), "server-round": 1, protocol.PROXIMAL_MU: mu}
    )
    reply, _ = FedProxClient().train(env, ArrayRecord(global_model.state_dict()), config)
    trained = reply.to_torch_state_dict()
    return float(
        sum(((trained[k] - v) ** 2).sum() for k, v in global_model.state_dict().items()).sqrt()
    )


def test_positive_mu_keeps_client_weights_closer_to_global() -> None:
    env = ClientEnv.create(client_spec(_scenario({"name": "fedprox"})), 0, RecordDict())

    distances = [_distance_from_global(env, mu) for mu in (0.0, 0.1, 1.0)]

    # Same data, seed and start: only mu differs, and the drift shrinks with it.
    assert distances[0] > distances[1] > distances[2], distances
    assert distances[2] < 0.25 * distances[0], distances
