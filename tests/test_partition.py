"""Partitioners: sizes, disjointness, skew, determinism, local test splits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fedsim.core.config import ComponentConfig, DataConfig
from fedsim.core.data import load_dataset
from fedsim.core.partition import PARTITIONERS, DirichletParams, ShardsParams, partition_dataset

LABELS = load_dataset(DataConfig()).train_labels.numpy()


def _split(name: str, params: object, seed: int = 0, clients: int = 10) -> list[np.ndarray]:
    partitioner = PARTITIONERS.get(name)
    return partitioner(LABELS, clients, np.random.default_rng(seed), params)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("iid", PARTITIONERS.get("iid").Params()),
        ("dirichlet", DirichletParams(0.3)),
        ("shards", ShardsParams(2)),
    ],
)
def test_partitions_are_disjoint_and_cover_the_data(name: str, params: object) -> None:
    parts = _split(name, params)

    joined = np.concatenate(parts)
    assert len(joined) == len(LABELS)
    assert len(np.unique(joined)) == len(LABELS)


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards"])
def test_partitions_are_deterministic_in_the_seed(name: str) -> None:
    params = PARTITIONERS.get(name).Params()

    first, again, other = _split(name, params, 1), _split(name, params, 1), _split(name, params, 2)

    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_iid_sizes_are_equal() -> None:
    sizes = [len(p) for p in _split("iid", PARTITIONERS.get("iid").Params())]

    assert max(sizes) - min(sizes) <= 1


def _mean_label_skew(parts: list[np.ndarray]) -> float:
    """Mean total-variation distance of clients' label distributions from the global one."""
    overall = np.bincount(LABELS, minlength=10) / len(LABELS)
    skews = [
        0.5 * np.abs(np.bincount(LABELS[p], minlength=10) / len(p) - overall).sum() for p in parts
    ]
    return float(np.mean(skews))


def test_dirichlet_skew_grows_as_alpha_shrinks() -> None:
    skews = [
        np.mean(
            [
                _mean_label_skew(_split("dirichlet", DirichletParams(alpha), seed))
                for seed in range(3)
            ]
        )
        for alpha in (100.0, 1.0, 0.1)
    ]

    assert skews[0] < 0.1
    assert skews[0] < skews[1] < skews[2]
    assert skews[2] > 0.5


def test_shards_give_each_client_k_classes() -> None:
    parts = _split("shards", ShardsParams(2))

    assert all(len(np.unique(LABELS[p])) <= 2 for p in parts)


def test_client_splits_cap_samples_and_hold_out_a_local_test_set() -> None:
    cfg = replace(
        DataConfig(),
        samples_per_client=300,
        test_fraction=0.2,
        partitioner=ComponentConfig("dirichlet", {"alpha": 0.5}),
    )

    splits = partition_dataset(cfg, 5, 0)

    for split in splits:
        assert len(split.train) + len(split.test) <= 300
        assert not set(split.train) & set(split.test)
    assert splits == partition_dataset(cfg, 5, 0)
