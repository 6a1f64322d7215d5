"""fedsim.simulation.flower: each Flower internal is checked before use, with a fallback.

The flwr range in pyproject.toml allows other 1.x versions; there the
internals may differ. These tests simulate that with monkeypatch and check
that fedsim falls back to Flower's public behaviour and still runs.
"""

from __future__ import annotations

import queue
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from fedsim.core.scenario_file import scenario_from_dict
from fedsim.simulation import flower as boundary
from fedsim.simulation.flower import (
    registered_partitions,
    replaced_function_unchanged,
    simulated,
    waiting_nodes_polling,
)


def _changed_flower_loop(state: Any, q: Any, nodes_mapping: Any, f_stop: Any) -> None:
    """Stands in for a later Flower's message loop: a different source."""
    raise AssertionError("not called in these tests")


def test_the_patch_applies_to_this_flower_and_is_restored() -> None:
    vce_api = boundary._vce_api()
    original = vce_api.add_messages_to_queue

    assert replaced_function_unchanged()
    with waiting_nodes_polling() as active:
        assert active
        assert vce_api.add_messages_to_queue is boundary._queue_waiting_messages
    assert vce_api.add_messages_to_queue is original


def test_a_changed_flower_loop_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    vce_api = boundary._vce_api()
    monkeypatch.setattr(vce_api, "add_messages_to_queue", _changed_flower_loop)

    assert not replaced_function_unchanged()
    with waiting_nodes_polling() as active:
        assert not active
        assert vce_api.add_messages_to_queue is _changed_flower_loop


def test_the_replacement_asks_only_nodes_with_waiting_messages() -> None:
    def message(node: int, delivered: str = "") -> Any:
        return SimpleNamespace(metadata=SimpleNamespace(dst_node_id=node, delivered_at=delivered))

    store = {"a": message(7), "b": message(5, delivered="yesterday"), "c": message(9)}
    asked: list[int] = []
    stop = threading.Event()

    def get_message_ins(node_id: int, limit: int) -> list[Any]:
        asked.append(node_id)
        stop.set()  # one sweep
        return [m for m in store.values() if m.metadata.dst_node_id == node_id][:limit]

    state = SimpleNamespace(
        lock=threading.Lock(), message_ins_store=store, get_message_ins=get_message_ins
    )
    out: queue.Queue[Any] = queue.Queue()

    boundary._queue_waiting_messages(state, out, {5: 0, 7: 1, 9: 2}, stop)

    assert asked == [7, 9]  # node 5's message was delivered; in the mapping's order
    assert [out.get_nowait().metadata.dst_node_id for _ in range(2)] == [7, 9]


def test_partitions_from_registration_order_only_when_readable() -> None:
    grid = SimpleNamespace(state=SimpleNamespace(nodes={30: None, 10: None, 20: None}))

    assert registered_partitions(grid, [10, 20, 30]) == {0: 30, 1: 10, 2: 20}  # type: ignore[arg-type]
    assert registered_partitions(grid, [10, 20]) is None  # type: ignore[arg-type]
    assert registered_partitions(SimpleNamespace(), [10]) is None  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_run_on_a_changed_flower_falls_back_and_gives_the_same_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedsim.simulation.runner import run_scenario

    scenario = scenario_from_dict(
        {
            "name": "fallback",
            "federation": {"num-clients": 3, "clients-per-round": 2, "rounds": 2, "seed": 1},
            "data": {"dataset": "mnist-embedded", "samples-per-client": 40},
            "model": {"name": "lenet-zhu"},
            "client": {"local-steps": 2, "batch-size": 8, "optimizer": "sgd", "lr": 0.05},
        }
    )
    patched = run_scenario(scenario, tmp_path / "patched").run_dir

    # A Flower whose message loop and node registration fedsim cannot read.
    vce_api = boundary._vce_api()
    original = vce_api.add_messages_to_queue
    monkeypatch.setattr(
        vce_api,
        "add_messages_to_queue",
        lambda state, q, nodes_mapping, f_stop: original(state, q, nodes_mapping, f_stop),
    )
    monkeypatch.setattr(
        "fedsim.simulation.discovery.registered_partitions", lambda grid, nodes: None
    )
    fallback = run_scenario(scenario, tmp_path / "fallback").run_dir

    compared = ["train-loss", "test-acc", "test-loss", "clients-trained"]
    first, second = (pd.read_csv(d / "metrics.csv")[compared] for d in (patched, fallback))
    pd.testing.assert_frame_equal(first, second)


def test_simulated_grid_is_recognised_and_falls_back_to_its_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flwr.superlink.grid import InMemoryGrid

    assert simulated(object.__new__(InMemoryGrid))
    assert not simulated(SimpleNamespace())  # type: ignore[arg-type]
    # A Flower without that class: a grid holding an in-memory link state is one.
    monkeypatch.setitem(sys.modules, "flwr.superlink.grid", None)
    assert simulated(SimpleNamespace(state=object()))  # type: ignore[arg-type]
    assert not simulated(SimpleNamespace())  # type: ignore[arg-type]
