"""FedAvg's aggregate is the example-weighted mean, identical to Flower's own."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from fedsim.strategies.fedavg import FedAvg
from fedsim.strategies.sampling import PartitionSampler


def _replies(seed: int) -> tuple[list[Message], list[dict[str, np.ndarray]], list[int]]:
    rng = np.random.default_rng(seed)
    weights, sizes, messages = [], [], []
    for partition, size in enumerate((10, 30, 60)):
        state = {
            "w": rng.normal(size=(4, 3)).astype(np.float32),
            "b": rng.normal(size=3).astype(np.float32),
        }
        record = RecordDict(
            {
                "arrays": ArrayRecord({k: torch.from_numpy(v) for k, v in state.items()}),
                "metrics": MetricRecord(
                    {
                        "num-examples": size,
                        "train-loss": float(partition),
                        "partition-id": partition,
                    }
                ),
            }
        )
        messages.append(Message(content=record, dst_node_id=partition, message_type="train"))
        weights.append(state)
        sizes.append(size)
    return messages, weights, sizes


def test_aggregate_is_example_weighted_mean_and_matches_flower(message_identity: None) -> None:
    messages, weights, sizes = _replies(0)

    ours, metrics = FedAvg().aggregate_train(1, messages)
    flowers, _ = FlowerFedAvg().aggregate_train(1, messages)

    assert ours is not None and flowers is not None and metrics is not None
    total = sum(sizes)
    for key in ("w", "b"):
        expected = sum(n * w[key] for n, w in zip(sizes, weights, strict=True)) / total
        np.testing.assert_allclose(ours[key].numpy(), expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(ours[key].numpy(), flowers[key].numpy())
    assert abs(metrics["train-loss"] - (0 * 10 + 1 * 30 + 2 * 60) / total) < 1e-9
    assert "partition-id" not in metrics


def test_sampling_is_seeded_by_round_and_partition() -> None:
    sampler = PartitionSampler({p: 100 + p for p in range(20)}, seed=5, per_round=4)

    first = [sampler.train_partitions(r) for r in range(1, 6)]
    again = [sampler.train_partitions(r) for r in range(1, 6)]

    assert first == again
    assert all(len(set(s)) == 4 for s in first)
    assert len({tuple(s) for s in first}) > 1
    assert sampler.nodes(first[0]) == [100 + p for p in first[0]]
