"""Injected client failures: seeded, tolerated up to the strategy's threshold, recorded."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from rich.console import Console
from test_resume import TINY, reference_run

from fedsim.clients.failures import STRAGGLER_GRACE_S, InjectedFailure, inject_failures
from fedsim.core import protocol
from fedsim.core.config import ScenarioError
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.outputs.run_folder import CLIENTS_FILE, METRICS_FILE
from fedsim.simulation.failures import FailurePlan, mark
from fedsim.simulation.loop import Exchange
from fedsim.simulation.runner import run_scenario
from fedsim.strategies.base import TooFewReplies
from fedsim.strategies.fedavg import FedAvg
from fedsim.strategies.sampling import PartitionSampler, SampledGrid

NODE = 100  # node id of partition p is NODE + p


def test_the_plan_fails_a_seeded_share_of_the_sampled_clients() -> None:
    plan = FailurePlan(seed=0, fraction=0.2, kind="raise")
    sampled = list(range(0, 20, 2))

    per_round = [plan.failing(r, sampled) for r in range(1, 6)]

    assert all(len(f) == 2 and set(f) <= set(sampled) for f in per_round)
    assert per_round == [plan.failing(r, sampled) for r in range(1, 6)]  # same seed, same clients
    assert len({tuple(f) for f in per_round}) > 1  # rounds differ
    other_seed = FailurePlan(seed=1, fraction=0.2, kind="raise")
    assert [other_seed.failing(r, sampled) for r in range(1, 6)] != per_round
    assert FailurePlan(0, 0.34, "raise").failing(1, [0, 1, 2]) != []  # 1.02 rounds to 1
    assert FailurePlan(0, 0.1, "raise").failing(1, [0, 1, 2, 3]) == []  # 0.4 rounds to 0


@pytest.mark.parametrize(
    ("failures", "key"),
    [
        ({"fraction": 1.5}, "failures.fraction"),
        ({"fraction": -0.1}, "failures.fraction"),
        ({"kind": "vanish"}, "failures.kind"),
        ({"timeout": 0}, "failures.timeout"),
        ({"min-replies": 0}, "failures.min-replies"),
        ({"retries": 2}, "failures.retries"),
    ],
)
def test_bad_failure_options_name_their_key(failures: dict[str, Any], key: str) -> None:
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict({**TINY, "failures": failures})
    assert err.value.key == key


def test_failures_that_starve_every_round_stop_before_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_ray(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the simulation started")

    monkeypatch.setattr("flwr.simulation.run_simulation", no_ray)
    # FedAvg needs 2 of the 3 sampled clients; 0.67 fails 2.
    scenario = scenario_from_dict({**TINY, "failures": {"fraction": 0.67}})

    with pytest.raises(ScenarioError, match="needs 2 replies") as err:
        run_scenario(scenario, tmp_path / "run", console=Console(quiet=True))
    assert err.value.key == "failures.fraction"
    lenient = scenario_from_dict({**TINY, "failures": {"fraction": 0.67, "min-replies": 0.3}})
    with pytest.raises(AssertionError, match="the simulation started"):
        run_scenario(lenient, tmp_path / "run", console=Console(quiet=True))


def _request(partition: int, message_type: str = MessageType.TRAIN) -> Message:
    message = Message(content=RecordDict(), dst_node_id=NODE + partition, message_type=message_type)
    message.metadata.__dict__["_message_id"] = f"request-{partition}"
    return message


def _reply(request: Message, arrays: ArrayRecord | None = None) -> Message:
    partition = request.metadata.dst_node_id - NODE
    metrics = MetricRecord({"num-examples": 10, "train-loss": 1.0, "partition-id": partition})
    content = RecordDict({"metrics": metrics})
    if arrays is not None:
        content["arrays"] = arrays
    return Message(content, reply_to=request)


@pytest.mark.usefixtures("message_identity")
def test_a_round_aggregates_with_enough_replies_and_stops_below() -> None:
    sampler = PartitionSampler({p: NODE + p for p in range(4)}, seed=3, per_round=3)
    grid = SampledGrid(None, sampler, FedAvg.min_replies)  # the threshold is the grid's
    arrays = ArrayRecord({"w": torch.ones(2)})
    ok = [_reply(_request(p), arrays) for p in (0, 1)]
    error = Message(Error(code=0, reason="client crashed"), reply_to=_request(2))

    grid.check_replies(1, 3, [*ok, error])  # 2 of 3: FedAvg needs 2
    new_arrays, _ = FedAvg().aggregate_train(1, [*ok, error])

    assert new_arrays is not None
    with pytest.raises(TooFewReplies, match="1 of 3 sampled clients replied; the strategy needs 2"):
        grid.check_replies(2, 3, [ok[0], error])


@pytest.mark.usefixtures("message_identity")
def test_the_client_mod_fails_marked_messages_only() -> None:
    context = Context(run_id=1, node_id=NODE, node_config={}, state=RecordDict(), run_config={})
    handled: list[Message] = []

    def handler(msg: Message, ctx: Context) -> Message:
        handled.append(msg)
        return msg

    plain = _request(0)
    assert inject_failures(plain, context, handler) is plain
    with pytest.raises(InjectedFailure, match="raise"):
        inject_failures(mark(plain, "raise", time.time() + 60), context, handler)
    deadline = time.time() + 0.3
    with pytest.raises(InjectedFailure, match="timeout"):
        inject_failures(mark(plain, "timeout", deadline), context, handler)
    assert time.time() >= deadline + STRAGGLER_GRACE_S  # silent past the server's deadline
    assert handled == [plain]
    assert protocol.FAILURE not in plain.content.config_records  # the shared content is untouched


class FakeGrid:
    """A push/pull grid: clients answer at once, marked ones fail, ``silent`` ones never answer."""

    def __init__(self, silent: Iterable[int] = (), wrong_partition: bool = False) -> None:
        self.silent = set(silent)
        self.wrong_partition = wrong_partition
        self.batches: list[list[int]] = []
        self.ready: dict[str, Message] = {}
        self.late: dict[str, Message] = {}
        self.count = 0

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids, batch = [], []
        for message in messages:
            self.count += 1
            message.metadata.__dict__["_message_id"] = f"m{self.count}"
            partition = message.metadata.dst_node_id - NODE
            batch.append(partition)
            ids.append(message.metadata.message_id)
            failure = message.content.config_records.get(protocol.FAILURE)
            if failure is not None and failure["kind"] == "raise":
                reply = Message(Error(code=0, reason="injected"), reply_to=message)
            else:
                reply = _reply(message)
                if self.wrong_partition:
                    reply.content["metrics"]["partition-id"] = partition + 1
            silent = partition in self.silent or (
                failure is not None and failure["kind"] == "timeout"
            )
            (self.late if silent else self.ready)[message.metadata.message_id] = reply
        self.batches.append(batch)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.ready.pop(i) for i in list(message_ids) if i in self.ready]


@pytest.mark.usefixtures("message_identity")
def test_stragglers_go_last_and_count_as_timeouts_at_the_deadline() -> None:
    grid = FakeGrid()
    plan = FailurePlan(seed=0, fraction=0.5, kind="timeout")
    exchange = Exchange(grid, 0.3, {NODE + p: p for p in range(4)}, plan)  # type: ignore[arg-type]
    stragglers = plan.failing(1, [0, 1, 2, 3])
    started = time.monotonic()

    replies, failed = exchange.send_and_receive(1, [_request(p) for p in (3, 1, 2, 0)], True)

    assert time.monotonic() - started >= 0.3
    assert failed == {p: "timeout" for p in stragglers}
    healthy = sorted(set(range(4)) - set(stragglers))
    assert [r.metadata.src_node_id - NODE for r in replies] == healthy  # sorted by partition
    assert [sorted(b) for b in grid.batches] == [healthy, stragglers]
    grid.ready.update(grid.late)  # the stragglers answer after the deadline
    exchange.send_and_receive(2, [], True)
    assert grid.ready == {}  # their late replies were pulled and dropped


@pytest.mark.usefixtures("message_identity")
def test_raising_clients_and_silent_ones_are_told_apart() -> None:
    plan = FailurePlan(seed=0, fraction=0.25, kind="raise")
    [raised] = plan.failing(1, [0, 1, 2, 3])
    silent = (raised + 1) % 4
    grid = FakeGrid(silent={silent})
    exchange = Exchange(grid, 0.2, {NODE + p: p for p in range(4)}, plan)  # type: ignore[arg-type]

    replies, failed = exchange.send_and_receive(1, [_request(p) for p in range(4)], True)

    assert failed == {raised: "error", silent: "timeout"}
    assert len(grid.batches) == 1  # raising clients need no ordering
    assert [r.has_error() for r in replies] == [p == raised for p in range(4) if p != silent]


@pytest.mark.usefixtures("message_identity")
def test_a_reply_from_an_unexpected_partition_stops_the_run() -> None:
    exchange = Exchange(FakeGrid(wrong_partition=True), 1.0, {NODE: 0})  # type: ignore[arg-type]

    with pytest.raises(RuntimeError, match="replied as partition 1"):
        exchange.send_and_receive(1, [_request(0)])


@pytest.mark.slow
def test_raising_clients_are_tolerated_and_recorded(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run = reference_run(tmp_path_factory.getbasetemp())  # TINY: 1 of 3 sampled raises
    metrics = pd.read_csv(run / METRICS_FILE)
    clients = pd.read_csv(run / CLIENTS_FILE)

    assert list(metrics["failures"]) == [1, 1, 1, 1]
    assert list(metrics["clients-trained"]) == [2, 2, 2, 2]
    plan = FailurePlan(TINY["federation"]["seed"], 0.34, "raise")
    for server_round, rows in clients.query("phase == 'train'").groupby("round"):
        sampled = sorted(rows["partition-id"])
        failed = rows.loc[rows["failure"].notna(), ["partition-id", "failure"]]
        assert len(sampled) == 3
        assert failed.values.tolist() == [[p, "error"] for p in plan.failing(server_round, sampled)]


@pytest.mark.slow
def test_clients_past_the_reply_deadline_are_recorded_as_timeouts(tmp_path: Path) -> None:
    table = {
        **TINY,
        "federation": {**TINY["federation"], "rounds": 2},
        "failures": {"fraction": 0.34, "kind": "timeout", "timeout": 3.0},
    }
    scenario = scenario_from_dict(table)

    run_scenario(scenario, tmp_path / "run", console=Console(quiet=True))

    metrics = pd.read_csv(tmp_path / "run" / METRICS_FILE)
    clients = pd.read_csv(tmp_path / "run" / CLIENTS_FILE).query("phase == 'train'")
    assert list(metrics["failures"]) == [1, 1]
    assert (metrics["seconds"] >= 3.0).all()  # the server waited out the deadline
    assert clients["failure"].dropna().tolist() == ["timeout", "timeout"]
    # The same clients fail as when they raise: the plan depends on seed and round only.
    plan = FailurePlan(TINY["federation"]["seed"], 0.34, "timeout")
    for server_round, rows in clients.groupby("round"):
        failed = rows.loc[rows["failure"].notna(), "partition-id"].tolist()
        assert failed == plan.failing(server_round, sorted(rows["partition-id"]))
