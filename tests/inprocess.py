"""Run a strategy against the real ClientApp in this process, recording every message.

:class:`InProcessGrid` stands in for Flower's ``Grid``: it hands each message
to the real :func:`fedsim.clients.app.build_client_app` app with that node's own
``Context`` (so ``context.state`` persists across rounds, as in the
simulation) and keeps every message the server sent and received. The rounds
are driven by the engine's own :func:`fedsim.simulation.loop.run_rounds`, so tests see
exactly the messages a simulated server would, seconds faster than Ray.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from rich.console import Console

from fedsim.clients.app import build_client_app
from fedsim.clients.base import ClientEnv
from fedsim.clients.private_state import STATE_KEY
from fedsim.core import protocol
from fedsim.core.config import Scenario
from fedsim.core.data import load_dataset
from fedsim.core.protocol import RoundRecord
from fedsim.core.training import client_config_record
from fedsim.outputs.results import RunRecorder
from fedsim.outputs.run_folder import new_run_dir
from fedsim.scenario.components import Components, client_spec
from fedsim.scenario.validate import check_components
from fedsim.simulation.discovery import discover_partitions
from fedsim.simulation.flower import message_context
from fedsim.simulation.loop import run_rounds
from fedsim.simulation.runner import build_strategy, sampled_grid, serve
from fedsim.strategies import STRATEGIES
from fedsim.strategies.base import ServerResources
from fedsim.strategies.sampling import PartitionSampler

NODE_OFFSET = 100  # node ids differ from partition ids, as in the simulation


class InProcessGrid:
    """A ``Grid`` that delivers messages to a ``ClientApp`` in this process."""

    def __init__(self, app: ClientApp, num_nodes: int) -> None:
        self.app = app
        self.contexts = {
            NODE_OFFSET + p: Context(
                run_id=1,
                node_id=NODE_OFFSET + p,
                node_config={protocol.PARTITION_ID: p, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config={},
            )
            for p in range(num_nodes)
        }
        self.exchanges: list[tuple[Message, Message]] = []  # (sent, its reply)

    @property
    def sent(self) -> list[Message]:
        return [sent for sent, _ in self.exchanges]

    @property
    def received(self) -> list[Message]:
        return [reply for _, reply in self.exchanges]

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(
        self, messages: Iterable[Message], timeout: float | None = None
    ) -> list[Message]:
        replies = []
        for message in messages:
            replies.append(self.app(message, self.contexts[message.metadata.dst_node_id]))
            self.exchanges.append((message, replies[-1]))
        return replies

    def replies(self, message_type: str) -> list[Message]:
        """Received replies of one type (``train``, ``evaluate``, ``query``)."""
        return [m for m in self.received if m.metadata.message_type == message_type]

    def array_names(self) -> set[str]:
        """Every array name in any message sent or received, both ways."""
        return {
            name
            for message in self.sent + self.received
            for record in message.content.array_records.values()
            for name in record
        }

    def exchange(
        self, partition: int, message_type: str, server_round: int
    ) -> tuple[Message, Message]:
        """The message of one type sent to a partition in a round, and its reply."""
        (pair,) = [
            (sent, reply)
            for sent, reply in self.exchanges
            if sent.metadata.dst_node_id == NODE_OFFSET + partition
            and sent.metadata.message_type == message_type
            and sent.content["config"]["server-round"] == server_round
        ]
        return pair

    def state(self, partition: int) -> RecordDict:
        """Partition ``partition``'s ``context.state``."""
        return self.contexts[NODE_OFFSET + partition].state


@dataclass
class InProcessRun:
    """An in-process run: the strategy, the grid and what each round left.

    It is the loop's round callback: after every round it keeps the round
    record, the global arrays and each client's private state (the
    ``ArrayRecord`` that :mod:`fedsim.clients.private_state` keeps in node state).
    """

    strategy: Any
    grid: InProcessGrid
    final_arrays: ArrayRecord
    scenario: Scenario
    records: list[RoundRecord] = field(default_factory=list)
    arrays_per_round: list[ArrayRecord] = field(default_factory=list)
    private_per_round: list[dict[int, ArrayRecord | None]] = field(default_factory=list)

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> None:
        self.records.append(record)
        self.arrays_per_round.append(arrays)
        self.private_per_round.append(
            {p: self.grid.state(p).array_records.get(STATE_KEY) for p in self.partitions}
        )

    @property
    def partitions(self) -> list[int]:
        return [node - NODE_OFFSET for node in self.grid.get_node_ids()]

    def env(
        self, partition: int, state: RecordDict | None = None, state_dir: Path | None = None
    ) -> ClientEnv:
        """Partition ``partition``'s client world, with its node state unless ``state``."""
        node_state = self.grid.state(partition) if state is None else state
        return ClientEnv.create(client_spec(self.scenario), partition, node_state, state_dir)


def tiny_table(strategy: dict[str, Any], **tables: dict[str, Any]) -> dict[str, Any]:
    """A small scenario (raw tables) on embedded MNIST; ``tables`` update its tables."""
    table: dict[str, Any] = {
        "name": "inprocess",
        "federation": {"num-clients": 3, "rounds": 2, "seed": 0},
        "data": {"dataset": "mnist-embedded", "samples-per-client": 200, "normalize": True},
        "model": {"name": "lenet5-split"},
        "client": {"local-epochs": 1, "batch-size": 16, "optimizer": "adam", "lr": 0.003},
        "strategy": strategy,
    }
    for name, values in tables.items():
        table[name] = {**table.get(name, {}), **values}
    return table


def run_inprocess(scenario: Scenario, state_dir: Path | None = None) -> InProcessRun:
    """Run ``scenario``'s rounds with the real strategy, loop and ClientApp, in process."""
    with message_context():
        return _run(scenario, state_dir)


def _run(scenario: Scenario, state_dir: Path | None) -> InProcessRun:
    strategy_cls = STRATEGIES.get(scenario.strategy.name)
    fed = scenario.federation
    grid = InProcessGrid(
        build_client_app(client_spec(scenario), strategy_cls.client_routine, state_dir),
        fed.num_clients,
    )
    nodes = discover_partitions(grid)  # type: ignore[arg-type]
    sampler = PartitionSampler(nodes, fed.seed, fed.sampled_per_round, fed.evaluated_per_round)
    server = ServerResources(
        scenario.model, scenario.federation.seed, load_dataset(scenario.data), torch.device("cpu")
    )
    components = check_components(scenario)
    strategy = build_strategy(components, server)
    run = InProcessRun(strategy, grid, strategy.initial_arrays(), scenario)
    run.final_arrays = run_rounds(
        strategy,
        sampled_grid(grid, components, sampler),  # type: ignore[arg-type]
        run.final_arrays,
        range(1, fed.rounds + 1),
        train_config=client_config_record(scenario.client),
        evaluate_config={},
        callbacks=(run,),
        evaluate_fn=server.evaluate if strategy_cls.global_model else None,
    )
    return run


def inprocess_recorder(scenario: Scenario, out: Path) -> RunRecorder:
    """The recorder of an in-process run of ``scenario``, in a new run folder under ``out``."""
    run_dir = new_run_dir(scenario.output, scenario.name, out)
    return RunRecorder(run_dir, scenario.federation.rounds, Console(quiet=True))


def serve_inprocess(
    scenario: Scenario, out: Path, components: Components, recorder: RunRecorder | None = None
) -> tuple[InProcessGrid, RunRecorder]:
    """``components`` (validated from ``scenario``) served as a run serves them (strategy,
    audit, recorder, run folder under ``out`` unless ``recorder``'s) against the real
    ClientApp in process."""
    routine = STRATEGIES.get(scenario.strategy.name).client_routine
    grid = InProcessGrid(
        build_client_app(client_spec(scenario), routine, None), scenario.federation.num_clients
    )
    recorder = recorder or inprocess_recorder(scenario, out)
    with message_context():
        serve(grid, components, recorder, Console(quiet=True))  # type: ignore[arg-type]
    return grid, recorder
