"""Partitioners: split a dataset's training indices across clients.

Every partitioner is deterministic given the seed. A client receives index
arrays into the shared :class:`~fedsim.core.data.DatasetBundle`; its local test
split is carved from its own indices by :func:`client_split`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from fedsim.core.config import ComponentConfig, DataConfig, component_params, require
from fedsim.core.data import (
    DatasetBundle,
    feature_bundle,
    generated_dataset,
    load_dataset,
    load_raw,
)
from fedsim.core.flower_datasets import PREFIX, SUPPORTED, FlowerPartitioner
from fedsim.core.registry import Registry
from fedsim.core.seeds import SeedStream, stream_rng


class Partitioner(Protocol):
    """``partition(labels, num_clients, rng, params) -> one index array per client``.

    Flower Datasets' partitioners (``flwr:<class name>``) take the dataset's extra
    per-sample columns too (``columns=``; :mod:`fedsim.core.flower_datasets`).
    """

    @property
    def Params(self) -> type: ...

    def __call__(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, params: Any
    ) -> list[np.ndarray]: ...


PARTITIONERS: Registry[Partitioner] = Registry(
    "partitioner", group="fedsim.partitioners", needs=("Params",)
)


def _partitioner(name: str, params: type) -> Callable[[Callable[..., list[np.ndarray]]], Any]:
    def decorator(fn: Callable[..., list[np.ndarray]]) -> Any:
        fn.Params = params  # type: ignore[attr-defined]
        partitioner: Partitioner = fn  # type: ignore[assignment]  # now with its Params
        return PARTITIONERS.register(name)(partitioner)

    return decorator


@dataclass(frozen=True)
class IidParams:
    """IID: a uniform random split into equal shares."""


@dataclass(frozen=True)
class DirichletParams:
    """Label skew: each class is split across clients by Dirichlet(alpha) shares."""

    alpha: float = 0.5
    min_size: int = 1

    def __post_init__(self) -> None:
        require(self.alpha > 0, "alpha", self.alpha, "must be > 0")
        require(self.min_size >= 0, "min-size", self.min_size, "must be >= 0")


@dataclass(frozen=True)
class ShardsParams:
    """Pathological non-IID: each client holds shards of ``classes-per-client`` classes."""

    classes_per_client: int = 2

    def __post_init__(self) -> None:
        require(
            self.classes_per_client >= 1,
            "classes-per-client",
            self.classes_per_client,
            "must be >= 1",
        )


@_partitioner("iid", IidParams)
def iid(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, params: IidParams
) -> list[np.ndarray]:
    """Shuffled and cut into equal parts (IID)."""
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


@_partitioner("dirichlet", DirichletParams)
def dirichlet(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, params: DirichletParams
) -> list[np.ndarray]:
    """Label skew: each class split by Dirichlet(alpha) shares (smaller alpha, more skew)."""
    if num_clients * params.min_size > len(labels):
        raise ValueError(
            f"{num_clients} clients with min-size={params.min_size} samples each need "
            f"{num_clients * params.min_size}, the dataset has {len(labels)}; "
            "lower min-size or num-clients"
        )
    classes = np.unique(labels)
    # Redraw until every client has min_size samples (the usual FL benchmark rule),
    # bounded so that impossible requests fail instead of looping.
    for _attempt in range(1000):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_clients, params.alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= params.min_size:
            return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
    raise ValueError(
        f"dirichlet(alpha={params.alpha}) could not give every one of {num_clients} "
        f"clients min-size={params.min_size} samples; lower min-size or num-clients"
    )


@_partitioner("shards", ShardsParams)
def shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, params: ShardsParams
) -> list[np.ndarray]:
    """Pathological skew: label-sorted shards, classes-per-client shards to each client."""
    classes = len(np.unique(labels))
    if params.classes_per_client > classes:  # shards of every class: an IID split in disguise
        raise ValueError(
            f"classes-per-client = {params.classes_per_client} is above the dataset's "
            f"{classes} classes; allowed 1 to {classes}"
        )
    # Sort by label, cut into num_clients * k shards, deal k shards to each client.
    order = np.argsort(labels, kind="stable")
    num_shards = num_clients * params.classes_per_client
    pieces = np.array_split(order, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_clients, params.classes_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in assignment]


for _cls_name, _described in SUPPORTED.items():
    PARTITIONERS.register(PREFIX + _cls_name, _described)(FlowerPartitioner(_cls_name))


@dataclass(frozen=True)
class ClientSplit:
    """One client's indices: ``train`` into the shared training tensors; ``test`` and ``val``
    into the training tensors too, or into the held-out test tensors when ``from_test_set``."""

    train: np.ndarray
    test: np.ndarray
    val: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    from_test_set: bool = False


@functools.lru_cache(maxsize=4)
def partition_dataset(cfg: DataConfig, num_clients: int, seed: int) -> tuple[ClientSplit, ...]:
    """All clients' splits (computed once per process; cheap next to training).

    Stored datasets only: a generated one has no population-wide split (:func:`client_data`).
    """
    if generated_dataset(cfg):
        raise ValueError(f"dataset {cfg.dataset!r} is generated per client: use client_data")
    labels = load_dataset(cfg).train_labels.numpy()
    partitioner = PARTITIONERS.get(cfg.partitioner.name)
    params = component_params(partitioner, cfg.partitioner, "data.partitioner")
    rng = stream_rng(SeedStream.PARTITION, seed)
    if isinstance(partitioner, FlowerPartitioner):
        columns = load_raw(cfg).train_columns
        parts = partitioner(labels, num_clients, rng, params, columns=columns)
    else:
        parts = partitioner(labels, num_clients, rng, params)
    splits = []
    for client, indices in enumerate(parts):
        local = stream_rng(SeedStream.LOCAL_SPLIT, seed, client).permutation(indices)
        if cfg.samples_per_client:
            local = local[: cfg.samples_per_client]
        num_test = local_test_count(cfg, len(local))
        splits.append(ClientSplit(train=np.sort(local[num_test:]), test=np.sort(local[:num_test])))
    if cfg.local_eval_source == "test":
        held_out = len(load_dataset(cfg).test_labels)
        return tuple(
            replace(s, **test_set_slices(held_out, num_clients, seed, c), from_test_set=True)
            for c, s in enumerate(splits)
        )
    return tuple(splits)


def test_set_slices(
    held_out: int, num_clients: int, seed: int, client: int
) -> dict[str, np.ndarray]:
    """``local-eval-source = "test"``: client ``client``'s validation and test indices.

    The FedCG code's split: the test set shuffled once, cut into ``2 * num_clients``
    slices of ``held_out // (2 * num_clients)``; client ``i`` validates on slice ``i``
    and tests on slice ``i + num_clients``.
    """
    size = held_out // (2 * num_clients)
    order = stream_rng(SeedStream.TEST_SPLIT, seed).permutation(held_out)
    val = order[size * client : size * (client + 1)]
    test = order[size * (client + num_clients) : size * (client + num_clients + 1)]
    return {"val": np.sort(val), "test": np.sort(test)}


def client_size(cfg: DataConfig, client: int) -> int:
    """How many examples ``client`` of a generated dataset holds (capped by samples-per-client)."""
    generator = generated_dataset(cfg)
    if generator is None:
        raise ValueError(f"dataset {cfg.dataset!r} is not generated")
    size = generator.device_size(generator.params(cfg), client)
    return min(size, cfg.samples_per_client) if cfg.samples_per_client else size


def local_test_count(cfg: DataConfig, held: int) -> int:
    """Of ``held`` examples, how many a client keeps for its local test split."""
    return round(cfg.test_fraction * held)


@functools.lru_cache(maxsize=8)
def _generated_client(cfg: DataConfig, client: int) -> tuple[DatasetBundle, ClientSplit]:
    generator = generated_dataset(cfg)
    assert generator is not None
    params = generator.params(cfg)
    held = client_size(cfg, client)
    x, y = generator.device_examples(params, client, held, SeedStream.GENERATED_SAMPLES)
    num_train = held - local_test_count(cfg, held)
    _, classes = generator.shape(params)
    bundle = feature_bundle(cfg.dataset, (x, y), (x[:0], y[:0]), classes)
    split = ClientSplit(train=np.arange(num_train), test=np.arange(num_train, held))
    return bundle, split


def client_data(
    cfg: DataConfig, num_clients: int, seed: int, client: int
) -> tuple[DatasetBundle, ClientSplit]:
    """Client ``client``'s bundle and its split into local training and test indices.

    A stored dataset: the shared bundle and the client's part of
    :func:`partition_dataset`. A generated one: the client's own examples, drawn
    from its seed streams on demand (a few cached per process), split
    ``1 - test-fraction`` / ``test-fraction``; its cost is this client's alone.
    """
    if generated_dataset(cfg):
        return _generated_client(replace(cfg, partitioner=ComponentConfig("iid")), client)
    return load_dataset(cfg), partition_dataset(cfg, num_clients, seed)[client]
