"""The same scenario and seed give the same run: sampled clients, metrics, model.

Two whole Ray runs compared are
``test_resume.py::test_run_killed_after_round_2_resumes_to_the_same_metrics``: its
killed run is a second run of the reference's scenario and seed (rounds before the
kill compared row by row), resumed to the same final model.
"""

from __future__ import annotations

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
