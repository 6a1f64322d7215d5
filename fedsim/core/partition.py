"""Partitioners: split a dataset's training indices across clients.

Every partitioner is deterministic given the seed. A client receives index
arrays into the shared :class:`~fedsim.core.data.DatasetBundle`; its local test
split is carved from its own indices by :func:`client_split`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from fedsim.core.components import Resolved, resolve
from fedsim.core.config import ComponentConfig, DataConfig, require
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


@dataclass(frozen=True)
class GroupsParams:
    """Natural non-IID: one client per group (a text dataset's speaking role or file)."""

    min_size: int = 5
    order: Literal["random", "largest"] = "random"

    def __post_init__(self) -> None:
        require(self.min_size >= 1, "min-size", self.min_size, "must be >= 1")


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


@_partitioner("groups", GroupsParams)
def groups(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, params: GroupsParams
) -> list[np.ndarray]:
    """One client per group: of the groups (labels) with min-size examples, a seeded random
    choice or the largest ones; a text dataset's label is its example's role or file."""
    found, sizes = np.unique(labels, return_counts=True)
    kept = found[sizes >= params.min_size]
    if len(kept) < num_clients:
        raise ValueError(
            f"{len(kept)} groups hold min-size={params.min_size} examples, fewer than "
            f"{num_clients} clients; lower min-size or num-clients"
        )
    if params.order == "largest":
        chosen = kept[np.argsort(-sizes[sizes >= params.min_size], kind="stable")[:num_clients]]
    else:
        chosen = rng.choice(kept, size=num_clients, replace=False)
    return [np.flatnonzero(labels == group) for group in chosen]


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


T = TypeVar("T")


def _kept(store: OrderedDict[Hashable, T], size: int, key: Hashable, make: Callable[[], T]) -> T:
    """``store[key]``, made by ``make()`` on a miss; the ``size`` most recently used are kept."""
    if key in store:
        store.move_to_end(key)
        return store[key]
    value = store[key] = make()
    if len(store) > size:
        store.popitem(last=False)
    return value


_SPLITS: OrderedDict[Hashable, tuple[ClientSplit, ...]] = OrderedDict()
_GENERATED: OrderedDict[Hashable, tuple[DatasetBundle, ClientSplit]] = OrderedDict()


def resolve_partitioner(cfg: DataConfig) -> Resolved:
    """``data.partitioner``'s function and parameters (validation resolves it once)."""
    return resolve(PARTITIONERS, cfg.partitioner, "data.partitioner")


def resolve_generator(cfg: DataConfig) -> Resolved | None:
    """A generated dataset's generator and its ``data.generator`` parameters; ``None`` for
    a dataset of stored examples."""
    generator = generated_dataset(cfg)
    if generator is None:
        return None
    return Resolved(cfg.dataset, generator, generator.params(cfg), "data.generator")  # type: ignore[arg-type]


def partition_dataset(
    cfg: DataConfig, num_clients: int, seed: int, partitioner: Resolved | None = None
) -> tuple[ClientSplit, ...]:
    """All clients' splits (computed once per process; cheap next to training), by
    ``partitioner`` (``cfg.partitioner`` resolved; resolved here when not given).

    Stored datasets only: a generated one has no population-wide split (:func:`client_data`).
    """
    if generated_dataset(cfg):
        raise ValueError(f"dataset {cfg.dataset!r} is generated per client: use client_data")

    def split() -> tuple[ClientSplit, ...]:
        return _split(cfg, num_clients, seed, partitioner or resolve_partitioner(cfg))

    return _kept(_SPLITS, 4, (cfg, num_clients, seed), split)


def _split(
    cfg: DataConfig, num_clients: int, seed: int, resolved: Resolved
) -> tuple[ClientSplit, ...]:
    labels = load_dataset(cfg).train_labels.numpy()
    partitioner, params = resolved.cls, resolved.params
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


def client_size(cfg: DataConfig, client: int, generator: Resolved | None = None) -> int:
    """How many examples ``client`` of a generated dataset holds (capped by samples-per-client);
    ``generator``: the dataset's, resolved (resolved here when not given)."""
    generator = generator or resolve_generator(cfg)
    if generator is None:
        raise ValueError(f"dataset {cfg.dataset!r} is not generated")
    size = generator.cls.device_size(generator.params, client)
    return min(size, cfg.samples_per_client) if cfg.samples_per_client else size


def local_test_count(cfg: DataConfig, held: int) -> int:
    """Of ``held`` examples, how many a client keeps for its local test split."""
    return round(cfg.test_fraction * held)


def _generated_client(
    cfg: DataConfig, client: int, resolved: Resolved
) -> tuple[DatasetBundle, ClientSplit]:
    generator, params = resolved.cls, resolved.params
    held = client_size(cfg, client, resolved)
    x, y = generator.device_examples(params, client, held, SeedStream.GENERATED_SAMPLES)
    num_train = held - local_test_count(cfg, held)
    _, classes = generator.shape(params)
    bundle = feature_bundle(cfg.dataset, (x, y), (x[:0], y[:0]), classes)
    split = ClientSplit(train=np.arange(num_train), test=np.arange(num_train, held))
    return bundle, split


def client_data(
    cfg: DataConfig,
    num_clients: int,
    seed: int,
    client: int,
    partitioner: Resolved | None = None,
    generator: Resolved | None = None,
) -> tuple[DatasetBundle, ClientSplit]:
    """Client ``client``'s bundle and its split into local training and test indices.

    A stored dataset: the shared bundle and the client's part of
    :func:`partition_dataset`. A generated one: the client's own examples, drawn
    from its seed streams on demand (a few cached per process), split
    ``1 - test-fraction`` / ``test-fraction``; its cost is this client's alone.
    ``partitioner`` and ``generator``: ``cfg``'s, resolved (a client's spec carries
    them; resolved here when not given).
    """
    if generated_dataset(cfg):
        key = replace(cfg, partitioner=ComponentConfig("iid"))

        def draw() -> tuple[DatasetBundle, ClientSplit]:
            resolved = generator or resolve_generator(cfg)
            assert resolved is not None
            return _generated_client(key, client, resolved)

        return _kept(_GENERATED, 8, (key, client), draw)
    return load_dataset(cfg), partition_dataset(cfg, num_clients, seed, partitioner)[client]
