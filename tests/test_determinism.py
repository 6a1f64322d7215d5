"""The same scenario and seed give the same run: sampled clients, metrics, model."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from test_resume import assert_same_outcome, reference_run, scenario_file

from fedsim.core.config import load_scenario
from fedsim.simulation.runner import run_scenario
from fedsim.strategies.sampling import PartitionSampler


def test_sampling_depends_on_seed_and_round_not_on_node_ids() -> None:
    # Flower draws new random node ids in every simulation.
    first = PartitionSampler({p: 1000 + 7 * p for p in range(100)}, seed=5, per_round=10)
    second = PartitionSampler({p: 3 + 11 * p for p in range(100)}, seed=5, per_round=10)
    other_seed = PartitionSampler(first.node_of_partition, seed=6, per_round=10)

    rounds = range(1, 6)
    assert [first.train_partitions(r) for r in rounds] == [
        second.train_partitions(r) for r in rounds
    ]
    assert len({tuple(first.train_partitions(r)) for r in rounds}) == 5
    assert [first.train_partitions(r) for r in rounds] != [
        other_seed.train_partitions(r) for r in rounds
    ]
    assert first.partition_of[first.node_of_partition[42]] == 42


@pytest.mark.slow
def test_a_second_run_repeats_the_first_exactly(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    reference = reference_run(tmp_path_factory.getbasetemp())

    run_scenario(
        load_scenario(scenario_file(tmp_path)), tmp_path / "again", console=Console(quiet=True)
    )

    # metrics (but wall seconds), every client row with its partition id, the final model
    assert_same_outcome(tmp_path / "again", reference)
