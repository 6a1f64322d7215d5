"""Flower's own strategies by name, and fedsim's strategies as plain Flower strategies.

A scenario naming ``fedadam`` / ``krum`` / ... runs Flower's class with
fedsim's seeded sampling; its aggregate must be exactly what Flower's own
class computes from the same replies. Without the engine, fedsim's strategies
sample like Flower's and evaluate no global model.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import strategy as flower
from inprocess import InProcessGrid, run_inprocess, tiny_table

from fedsim.clients.app import build_client_app
from fedsim.core.config import ScenarioError
from fedsim.core.data import load_dataset
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.training import client_config_record
from fedsim.scenario.components import client_spec
from fedsim.scenario.validate import check_components
from fedsim.strategies import STRATEGIES
from fedsim.strategies.base import ServerResources
from fedsim.strategies.fedavg import FedAvg
from fedsim.strategies.fedcg import FedCG
from fedsim.strategies.fedprox import FedProx

BUILTINS = {
    "fedadam": (flower.FedAdam, {"eta": 0.05}),
    "fedyogi": (flower.FedYogi, {}),
    "fedadagrad": (flower.FedAdagrad, {"tau": 0.01}),
    "fedavgm": (flower.FedAvgM, {"server-momentum": 0.5}),
    "fedtrimmedavg": (flower.FedTrimmedAvg, {"beta": 0.3}),
    "krum": (flower.Krum, {"num-malicious-nodes": 1}),
    "fedmedian": (flower.FedMedian, {}),
}


def _tiny(strategy: dict[str, Any]) -> dict[str, Any]:
    return tiny_table(
        strategy,
        federation={"num-clients": 4, "rounds": 1},
        data={"samples-per-client": 40},
        model={"name": "lenet-zhu"},
        client={"local-steps": 2, "batch-size": 4, "optimizer": "sgd", "lr": 0.05},
    )


class _Nodes:
    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return self.nodes


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_aggregates_exactly_as_flowers_own(
    name: str, message_identity: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    flower_cls, params = BUILTINS[name]
    # FedMedian takes the arrays out of the replies it aggregates: keep copies.
    delivered: list[Message] = []
    deliver = InProcessGrid.send_and_receive

    def keep_copies(grid: InProcessGrid, messages: Any, timeout: Any = None) -> list[Message]:
        replies = deliver(grid, messages, timeout)
        delivered.extend(copy.deepcopy(replies))
        return replies

    monkeypatch.setattr(InProcessGrid, "send_and_receive", keep_copies)
    run = run_inprocess(scenario_from_dict(_tiny({"name": name, **params})))
    replies = [r for r in delivered if r.metadata.message_type == "train"]
    sent, _ = run.grid.exchange(0, "train", 1)
    reference = flower_cls(**{k.replace("-", "_"): v for k, v in params.items()})

    # Flower's own strategy, fed the same model and the same replies.
    nodes = sorted(r.metadata.src_node_id for r in replies)
    list(reference.configure_train(1, sent.content["arrays"], ConfigRecord(), _Nodes(nodes)))
    expected, _ = reference.aggregate_train(1, replies)

    assert expected is not None
    assert type(run.strategy).__mro__[2] is flower_cls
    ours = run.arrays_per_round[0]
    assert set(ours) == set(expected)
    for key in expected:
        np.testing.assert_array_equal(ours[key].numpy(), expected[key].numpy())
    # Something was learned: the aggregate moved away from the model sent.
    assert any(not np.array_equal(ours[k].numpy(), sent.content["arrays"][k].numpy()) for k in ours)
    assert run.records[0].server["test-acc"] >= 0  # the engine's held-out evaluation ran


@pytest.mark.parametrize("name", ["fedadam", "fedavgm"])
def test_server_optimiser_state_survives_a_checkpoint(
    name: str, message_identity: None, tmp_path: Path
) -> None:
    run = run_inprocess(scenario_from_dict(_tiny({"name": name, **BUILTINS[name][1]})))
    state = run.strategy.state_for_checkpoint()
    torch.save(state, tmp_path / "state.pt")

    fresh = STRATEGIES.get(name)()
    fresh.restore_checkpoint_state(torch.load(tmp_path / "state.pt", weights_only=True))

    assert state  # the first round created moments / momentum
    for attribute in state:
        before, after = getattr(run.strategy, attribute), getattr(fresh, attribute)
        if isinstance(before, dict):
            before, after = list(before.values()), list(after.values())
        for x, y in zip(before, after, strict=True):
            np.testing.assert_array_equal(x, y)


def test_builtin_parameters_are_checked_like_every_component() -> None:
    def check(strategy: dict[str, Any]) -> None:
        check_components(scenario_from_dict(_tiny(strategy)))

    check({"name": "fedadam", "eta": 0.5, "beta-1": 0.8})
    with pytest.raises(ScenarioError, match=r"strategy\.etta.*allowed keys: eta, eta-l"):
        check({"name": "fedadam", "etta": 0.5})
    with pytest.raises(ScenarioError, match=r"strategy\.eta = 'fast': must be a number"):
        check({"name": "fedadam", "eta": "fast"})
    # Flower's own constructor check, reported as a scenario error before anything starts.
    with pytest.raises(ScenarioError, match=r"beta.*must be in the range \[0, 0.5\)"):
        check({"name": "fedtrimmedavg", "beta": 0.7})


def test_fedsim_strategies_take_keyword_hyper_parameters_with_papers_defaults() -> None:
    assert FedProx().params.proximal_mu == 0.01
    assert FedProx(proximal_mu=0.1).params.proximal_mu == 0.1
    fedcg = FedCG(distill_iterations=10, fraction_train=0.5)
    assert (fedcg.params.distill_iterations, fedcg.params.distill_batch_size) == (10, 16)
    assert fedcg.fraction_train == 0.5  # Flower's own options pass through
    with pytest.raises(ScenarioError, match="proximal-mu"):
        FedProx(proximal_mu=-1)
    for name in ("fedavg", "fedprox", "fedsplit", "fedcg", "local", *BUILTINS):
        cls = STRATEGIES.get(name)
        assert isinstance(cls.from_params(cls.Params()), flower.Strategy)


def test_outside_fedsims_loop_sampling_is_flowers(message_identity: None) -> None:
    strategy = FedAvg(fraction_train=0.5, min_train_nodes=1, min_available_nodes=1)
    arrays = ArrayRecord({"w": torch.zeros(3)})

    messages: list[Message] = list(
        strategy.configure_train(3, arrays, ConfigRecord(), _Nodes([11, 12, 13, 14]))  # type: ignore[arg-type]
    )

    assert len(messages) == 2
    assert {m.metadata.dst_node_id for m in messages} <= {11, 12, 13, 14}
    assert messages[0].content["config"]["server-round"] == 3
    with pytest.raises(RuntimeError, match=r"needs network=.*pass initial_arrays instead"):
        strategy.initial_arrays()


class _ByPartition(InProcessGrid):
    """Replies in partition order, as fedsim's loop sorts them: float sums depend on
    the order, and Flower's start() keeps the order it shuffled the nodes in."""

    def send_and_receive(
        self, messages: Iterable[Message], timeout: float | None = None
    ) -> list[Message]:
        replies = super().send_and_receive(messages, timeout)
        return sorted(replies, key=lambda reply: reply.metadata.src_node_id)


@pytest.mark.parametrize(
    ("table", "build"),
    [
        ({"name": "fedavg"}, lambda network: FedAvg(network=network)),
        ({"name": "fedprox", "proximal-mu": 0.1}, lambda network: FedProx(0.1, network=network)),
    ],
    ids=["fedavg", "fedprox"],
)
def test_a_fedsim_strategy_runs_unchanged_under_flowers_start(
    table: dict[str, Any], build: Any, message_identity: None
) -> None:
    # Every client every round, so that Flower's unseeded sampling picks the same.
    scenario = scenario_from_dict(tiny_table(table, federation={"num-clients": 3, "rounds": 2}))
    server = ServerResources(
        scenario.model, scenario.federation.seed, load_dataset(scenario.data), torch.device("cpu")
    )
    strategy = build(server.model)  # as a Flower user builds it
    grid = _ByPartition(build_client_app(client_spec(scenario), strategy.client_routine), 3)

    initial = strategy.initial_arrays()
    result = strategy.start(
        grid,
        initial,
        num_rounds=2,
        train_config=ConfigRecord(client_config_record(scenario.client)),
        evaluate_fn=server.evaluate,
    )
    ours = run_inprocess(scenario)  # the same scenario under fedsim's loop

    assert len(grid.replies("train")) == 6 and set(ours.final_arrays) == set(result.arrays)
    for key in result.arrays:
        np.testing.assert_array_equal(result.arrays[key].numpy(), ours.final_arrays[key].numpy())
    assert any(not np.array_equal(result.arrays[k].numpy(), initial[k].numpy()) for k in initial)
    flowers_eval = result.evaluate_metrics_serverapp[2]
    assert dict(flowers_eval) == ours.records[1].server


@pytest.mark.slow
def test_the_audit_attacks_replies_to_a_flower_builtin(tmp_path: Path) -> None:
    from fedsim.simulation.runner import run_scenario

    table = _tiny({"name": "fedmedian"})
    table["federation"] = {"num-clients": 2, "rounds": 1, "seed": 0}
    table["client"] = {"local-steps": 1, "batch-size": 1, "optimizer": "sgd", "lr": 0.01}
    table["model"] = {"name": "lenet-zhu", "init": "uniform"}
    table["audit"] = {"enabled": True, "attacks": [{"name": "dlg", "steps": 5, "restarts": 1}]}

    run_dir = run_scenario(scenario_from_dict(table), tmp_path / "run").run_dir

    audit = pd.read_csv(run_dir / "audit.csv")
    assert list(audit["strategy"]) == ["fedmedian"]
    assert np.isfinite(audit["psnr"]).all() and (audit["batch-size"] == 1).all()


def test_the_start_up_banner_tells_the_hyper_parameters() -> None:
    import logging

    strategy = FedProx(proximal_mu=0.1)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(handler)
    level = flwr_logger.level
    flwr_logger.setLevel(logging.INFO)
    try:
        strategy.summary()
    finally:
        flwr_logger.removeHandler(handler)
        flwr_logger.setLevel(level)

    banner = "\n".join(records)
    assert "proximal_mu=0.1" in banner
    assert "Fraction" in banner  # Flower's own sampling: what happens under its start()
