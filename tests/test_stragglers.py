"""Stragglers as the FedProx paper defines them: seeded, told their epochs, dropped or kept.

The in-process runs drive the real strategy, round loop and ClientApp on
Synthetic(0.5, 0.5) with ``logreg`` (seconds, no Ray); FedProx runs at
``proximal-mu = 0``, so its clients train exactly as FedAvg's and the two
aggregates differ only in what happens to the stragglers' replies.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from inprocess import NODE_OFFSET, InProcessRun, run_inprocess, tiny_table
from rich.console import Console

from fedsim.clients.fedavg import FedAvgClient
from fedsim.core import protocol
from fedsim.core.config import ScenarioError
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.training import client_config_record
from fedsim.outputs.results import RunRecorder
from fedsim.outputs.run_folder import CLIENTS_FILE, METRICS_FILE
from fedsim.scenario.validate import check_components, check_stragglers
from fedsim.strategies import STRATEGIES
from fedsim.strategies.base import EngineHooks
from fedsim.strategies.stragglers import StragglerPlan

EPOCHS = 4
SAMPLED = 4


def _table(strategy: dict[str, Any], stragglers: float = 0.5) -> dict[str, Any]:
    return {
        "name": "stragglers",
        "federation": {
            "num-clients": 6,
            "clients-per-round": SAMPLED,
            "rounds": 2,
            "seed": 1,
            "stragglers": stragglers,
        },
        "data": {
            "dataset": "synthetic",
            "samples-per-client": 120,
            "generator": {"alpha": 0.5, "beta": 0.5, "test-devices": 6, "test-samples": 20},
        },
        "model": {"name": "logreg"},
        "client": {"local-epochs": EPOCHS, "batch-size": 10, "lr": 0.01},
        "strategy": strategy,
    }


def _run(strategy: dict[str, Any]) -> InProcessRun:
    return run_inprocess(scenario_from_dict(_table(strategy)))


@pytest.fixture(scope="module")
def fedavg() -> InProcessRun:
    return _run({"name": "fedavg"})


@pytest.fixture(scope="module")
def fedprox() -> InProcessRun:
    return _run({"name": "fedprox", "proximal-mu": 0.0})


def test_the_plan_follows_the_seed_round_and_partition() -> None:
    plan = StragglerPlan(seed=7, fraction=0.9, epochs=20)
    sampled = list(range(0, 30, 3))

    first = plan.stragglers(1, sampled)
    assert first == plan.stragglers(1, list(reversed(sampled)))  # a resumed run draws the same
    assert len(first) == 9 and set(first) <= set(sampled)  # 90 % of 10, rounded half up
    assert plan.stragglers(2, sampled) != first
    assert StragglerPlan(8, 0.9, 20).stragglers(1, sampled) != first
    # A straggler's epochs are its own draw: the same whoever else was sampled with it.
    again = plan.stragglers(1, [*sampled[:5], 31, 32, 33, 34, 35])
    assert all(again[p] == first[p] for p in set(again) & set(first))
    assert StragglerPlan(7, 0.5, 20).stragglers(1, sampled).keys() != first.keys()
    assert StragglerPlan(7, 0.0, 20).stragglers(1, sampled) == {}

    # Epochs uniform in 1..E: over 300 rounds every value shows, about equally often.
    epochs = [e for r in range(1, 301) for e in plan.stragglers(r, sampled).values()]
    counts = np.bincount(epochs, minlength=21)[1:]
    assert counts.min() > 0 and len(counts) == 20
    assert abs(np.mean(epochs) - 10.5) < 0.5, np.mean(epochs)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"federation": {"stragglers": 1.0}}, "federation.stragglers = 1.0: must be in [0, 1)"),
        ({"federation": {"stragglers": -0.1}}, "must be in [0, 1)"),
        ({"client": {"local-steps": 5}}, "client.local-steps must be 0"),
    ],
)
def test_bad_straggler_settings_are_refused_in_one_line(
    change: dict[str, dict[str, Any]], expected: str
) -> None:
    table = _table({"name": "fedavg"})
    for name, values in change.items():
        table[name] = {**table[name], **values}
    with pytest.raises(ScenarioError) as caught:
        check_components(scenario_from_dict(table))
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_the_audit_reads_each_stragglers_epochs_from_its_reply(message_identity: None) -> None:
    # A straggler's reply echoes the epochs it trained: the audit's view of that client
    # (its config, the examples its update touched) follows the reply, not the round's.
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    from fedsim.audit.observe import intercept
    from fedsim.core.training import client_config_record

    table = tiny_table({"name": "fedavg"}, federation={"stragglers": 0.5}, audit={"enabled": True})
    scenario = scenario_from_dict(table)
    assert check_components(scenario).attacks  # the update threat model is accepted
    config = ConfigRecord({**client_config_record(scenario.client), "server-round": 1})
    replies = [
        Message(
            RecordDict(
                {
                    "arrays": ArrayRecord(),
                    "metrics": MetricRecord(
                        {"num-examples": 40, "partition-id": p, "straggler": p, "local-epochs": e}
                    ),
                }
            ),
            dst_node_id=p,
            message_type="train",
        )
        for p, e in ((0, scenario.client.local_epochs), (1, 1))
    ]
    intercepted = intercept(1, ArrayRecord(), config, replies)
    full, straggler = intercepted.replies
    assert full.config == scenario.client and straggler.config.local_epochs == 1
    assert straggler.examples_touched <= full.examples_touched


def test_a_strategy_that_cannot_run_stragglers_is_refused() -> None:
    # Every shipped strategy is built on FedAvg; a plugin's own FedsimStrategy need not be.
    class Unaware(EngineHooks):
        pass

    with pytest.raises(ScenarioError, match="strategy 'fedavg' cannot run stragglers; these can"):
        scenario = scenario_from_dict(_table({"name": "fedavg"}))
        check_stragglers(scenario.federation, scenario.client, "fedavg", Unaware)
    able = [n for n in STRATEGIES.names() if STRATEGIES.get(n).straggler_replies]
    assert {"fedavg", "fedprox"} <= set(able)


def _train_exchanges(run: InProcessRun, server_round: int) -> list[tuple[int, Message, Message]]:
    return [
        (sent.metadata.dst_node_id - NODE_OFFSET, sent, reply)
        for sent, reply in run.grid.exchanges
        if sent.metadata.message_type == "train"
        and sent.content["config"][protocol.SERVER_ROUND] == server_round
    ]


def test_the_server_tells_stragglers_their_epochs_and_the_client_trains_them(
    fedavg: InProcessRun,
) -> None:
    plan = StragglerPlan(1, 0.5, EPOCHS)
    for server_round in (1, 2):
        exchanges = _train_exchanges(fedavg, server_round)
        sampled = [partition for partition, _, _ in exchanges]
        stragglers = plan.stragglers(server_round, sampled)
        assert len(sampled) == SAMPLED and len(stragglers) == 2
        for partition, sent, reply in exchanges:
            config, metrics = sent.content["config"], reply.content["metrics"]
            epochs = stragglers.get(partition, EPOCHS)
            assert config[protocol.LOCAL_EPOCHS] == metrics[protocol.LOCAL_EPOCHS] == epochs
            assert config[protocol.STRAGGLER] == metrics[protocol.STRAGGLER]
            assert metrics[protocol.STRAGGLER] == int(partition in stragglers)

    # The routine honours the epochs it was told: its reply is k epochs of training, not E.
    partition, sent, reply = next(
        (p, s, r)
        for server_round in (1, 2)
        for p, s, r in _train_exchanges(fedavg, server_round)
        if s.content["config"][protocol.LOCAL_EPOCHS] < EPOCHS
    )
    told = sent.content["config"][protocol.LOCAL_EPOCHS]
    server_round = sent.content["config"][protocol.SERVER_ROUND]
    env = fedavg.env(partition)
    received = sent.content["arrays"]

    def trained(epochs: int) -> dict[str, torch.Tensor]:
        cfg = dataclasses.replace(fedavg.scenario.client, local_epochs=epochs)
        config = ConfigRecord({**client_config_record(cfg), protocol.SERVER_ROUND: server_round})
        arrays, _ = FedAvgClient().train(env, received, config)
        return arrays.to_torch_state_dict()

    replied = reply.content["arrays"].to_torch_state_dict()
    assert all(torch.equal(replied[k], v) for k, v in trained(told).items())
    assert not all(torch.equal(replied[k], v) for k, v in trained(EPOCHS).items())


def _weighted_mean(replies: list[Message]) -> dict[str, torch.Tensor]:
    weights = [float(r.content["metrics"][protocol.NUM_EXAMPLES]) for r in replies]
    states = [r.content["arrays"].to_torch_state_dict() for r in replies]
    return {
        key: sum(w * s[key] for w, s in zip(weights, states, strict=True)) / sum(weights)
        for key in states[0]
    }


def _assert_close(arrays: ArrayRecord, expected: dict[str, torch.Tensor]) -> None:
    got = arrays.to_torch_state_dict()
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value.to(got[key].dtype), rtol=1e-5, atol=1e-6)


def test_fedavg_drops_stragglers_and_fedprox_aggregates_them(
    fedavg: InProcessRun, fedprox: InProcessRun
) -> None:
    avg_round, prox_round = _train_exchanges(fedavg, 1), _train_exchanges(fedprox, 1)
    # mu = 0: the clients of both did the same work, bit for bit.
    for (_, _, a), (_, _, p) in zip(avg_round, prox_round, strict=True):
        a_state, p_state = (r.content["arrays"].to_torch_state_dict() for r in (a, p))
        assert all(torch.equal(a_state[k], p_state[k]) for k in a_state)

    on_time = [r for _, _, r in avg_round if not r.content["metrics"][protocol.STRAGGLER]]
    everyone = [r for _, _, r in prox_round]
    assert len(on_time) == 2 and len(everyone) == SAMPLED
    _assert_close(fedavg.arrays_per_round[0], _weighted_mean(on_time))
    _assert_close(fedprox.arrays_per_round[0], _weighted_mean(everyone))
    avg, prox = (run.arrays_per_round[0].to_torch_state_dict() for run in (fedavg, fedprox))
    assert max(float((avg[k] - prox[k]).abs().max()) for k in avg) > 1e-3  # dropping changed it

    # Dropped, not silently: the round records it; a straggler still counts as a reply.
    assert [r.train[protocol.STRAGGLERS_DROPPED] for r in fedavg.records] == [2, 2]
    assert [r.train[protocol.STRAGGLERS_DROPPED] for r in fedprox.records] == [0, 0]
    assert [r.replies for r in fedavg.records] == [SAMPLED, SAMPLED]
    # Per-client facts are not averaged into the round's train metrics.
    assert protocol.STRAGGLER not in fedavg.records[0].train
    assert protocol.LOCAL_EPOCHS not in fedavg.records[0].train


def test_clients_csv_records_each_straggler_and_its_epochs(
    fedavg: InProcessRun, tmp_path: Path
) -> None:
    recorder = RunRecorder(tmp_path, total_rounds=2, console=Console(quiet=True))
    for record, arrays in zip(fedavg.records, fedavg.arrays_per_round, strict=True):
        recorder.on_round_end(record, arrays)
    clients = pd.read_csv(tmp_path / CLIENTS_FILE).query("phase == 'train'")
    metrics = pd.read_csv(tmp_path / METRICS_FILE)

    plan = StragglerPlan(1, 0.5, EPOCHS)
    for server_round, rows in clients.groupby("round"):
        stragglers = plan.stragglers(int(server_round), sorted(rows["partition-id"]))
        got = {
            int(row["partition-id"]): (int(row["straggler"]), int(row["local-epochs"]))
            for _, row in rows.iterrows()
        }
        assert got == {
            p: (int(p in stragglers), stragglers.get(p, EPOCHS)) for p in rows["partition-id"]
        }
    assert list(metrics[protocol.STRAGGLERS_DROPPED]) == [2, 2]


def test_no_stragglers_leaves_messages_and_records_as_before() -> None:
    run = run_inprocess(scenario_from_dict(_table({"name": "fedavg"}, stragglers=0.0)))
    for _, sent, reply in _train_exchanges(run, 1):
        assert protocol.STRAGGLER not in sent.content["config"]
        assert protocol.STRAGGLER not in reply.content["metrics"]
    assert protocol.STRAGGLERS_DROPPED not in run.records[0].train
