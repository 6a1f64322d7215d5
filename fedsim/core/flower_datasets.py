"""Flower Datasets' partitioners on any dataset fedsim loads, and its local-files datasets.

A scenario names a Flower partitioner by its class name behind ``flwr:``
(``{ name = "flwr:DirichletPartitioner", alpha = 0.3 }``); its parameters are the
class's keyword arguments in kebab-case, read from its signature, except
``num_partitions`` and ``seed``, which fedsim gives (``federation.num-clients`` and
the partition seed stream). The partitioner runs on a ``datasets.Dataset`` built
from the labels, the dataset's extra per-sample columns (a ``writer`` id for
``NaturalIdPartitioner``) and an ``index`` column, shuffled by the seed first (as
``FederatedDataset`` shuffles before it partitions); each partition's ``index``
column is the client's index array.

``flwr_datasets`` and ``datasets`` are imported on first use only: together they
take seconds, and most runs name neither.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import functools
import inspect
import io
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

import numpy as np

from fedsim.core.errors import first_line

PREFIX = "flwr:"

GIVEN_BY_FEDSIM = {"num_partitions": "federation.num-clients", "seed": "federation.seed"}

LABEL = "label"
"""The column fedsim's labels are in, and ``partition-by``'s default."""

INDEX = "index"
"""The column that carries each row's position in the training set through a partition."""

SUPPORTED = {
    "IidPartitioner": "Flower Datasets: equal contiguous shares of the shuffled data (IID)",
    "DirichletPartitioner": "Flower Datasets: each class split by Dirichlet(alpha) shares",
    "InnerDirichletPartitioner": "Flower Datasets: given partition-sizes, classes by Dirichlet",
    "PathologicalPartitioner": "Flower Datasets: num-classes-per-partition classes per client",
    "ShardPartitioner": "Flower Datasets: label-sorted shards dealt to clients",
    "LinearPartitioner": "Flower Datasets: client i's share grows as i",
    "SquarePartitioner": "Flower Datasets: client i's share grows as i squared",
    "ExponentialPartitioner": "Flower Datasets: client i's share grows as e**i",
    "SizePartitioner": "Flower Datasets: partition-sizes, one per client",
    "NaturalIdPartitioner": "Flower Datasets: one client per distinct value of a column",
    "GroupedNaturalIdPartitioner": "Flower Datasets: group-size distinct ids of a column each",
    "ContinuousPartitioner": "Flower Datasets: split by a numeric column with a strictness",
}
"""Every partitioner of ``flwr_datasets.partitioner`` whose parameters TOML can give."""

LEFT_OUT = {
    "DistributionPartitioner": "its distribution-array is a 2-D array",
    "IdToSizeFncPartitioner": "its partition-id-to-size-fn is a function",
    "VerticalEvenPartitioner": "it splits columns (vertical FL), not samples",
    "VerticalSizePartitioner": "it splits columns (vertical FL), not samples",
    "Partitioner": "the abstract base class",
}
"""The rest of ``flwr_datasets.partitioner``, and why (``tests/test_flower_datasets.py``
checks the two lists cover the package)."""


def offline_import(module: str) -> types.ModuleType:
    """``module`` imported with Hugging Face's hub and Flower's telemetry switched off:
    nothing here goes online."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # a run prints its own
    import importlib

    return importlib.import_module(module)


def flower_class(name: str) -> type:
    """The class ``flwr_datasets.partitioner.<name>``."""
    return typing.cast(type, getattr(offline_import("flwr_datasets.partitioner"), name))


def _signature(cls_name: str) -> Mapping[str, inspect.Parameter]:
    """The keyword arguments of ``cls_name``'s constructor, annotations evaluated."""
    return inspect.signature(flower_class(cls_name), eval_str=True).parameters


class _NotTomlError(TypeError):
    """A parameter type TOML has no value for (a function, a 2-D array)."""


def _toml_type(tp: Any) -> Any:
    """Flower's type hint as one :func:`~fedsim.core.toml_tables.parse_table` checks: a list
    (or NumPy array) of X becomes ``tuple[X, ...]``, ``int | float`` a number."""
    origin = get_origin(tp)
    if tp in (int, float, str, bool, type(None)) or origin is Literal:
        return tp
    if origin in (types.UnionType, typing.Union):
        members = []
        for arg in get_args(tp):
            try:
                converted = _toml_type(arg)
            except _NotTomlError:
                continue  # an ndarray beside a list: the list is what TOML gives
            if converted not in members:
                members.append(converted)
        if int in members and float in members:
            members.remove(int)  # a number; parse_table takes 1 as 1.0
        if not members:
            raise _NotTomlError(tp)
        return functools.reduce(lambda a, b: a | b, members) if len(members) > 1 else members[0]
    if origin in (list, tuple, collections.abc.Sequence) and len(get_args(tp)) >= 1:
        item = _toml_type(get_args(tp)[0])
        if get_origin(item) is tuple:
            raise _NotTomlError(tp)  # nested lists: not a parameter fedsim takes
        return tuple[item, ...]  # type: ignore[valid-type]
    raise _NotTomlError(tp)


def _params_class(cls_name: str) -> type:
    """A frozen dataclass of ``cls_name``'s TOML-expressible keyword arguments, with its
    defaults (``partition_by`` defaults to ``"label"``)."""
    fields: list[tuple[str, Any, Any]] = []
    for name, param in _signature(cls_name).items():
        if name in GIVEN_BY_FEDSIM:
            continue
        default = param.default
        if name == "partition_by" and default is inspect.Parameter.empty:
            default = LABEL
        try:
            tp = _toml_type(param.annotation)
        except _NotTomlError:
            if default is inspect.Parameter.empty:
                raise TypeError(f"{cls_name}'s {name!r} has no TOML form") from None
            continue  # left at Flower's default
        if default is inspect.Parameter.empty:
            fields.append((name, tp, dataclasses.field()))
        else:
            if isinstance(default, list):
                default = tuple(default)
            fields.append((name, tp, dataclasses.field(default=default)))
    # Required fields first, as a dataclass needs; parse_table reports each by name.
    fields.sort(key=lambda f: f[2].default is not dataclasses.MISSING)
    doc = f"Flower Datasets' {cls_name}: its keyword arguments, kebab-case in TOML."
    return dataclasses.make_dataclass(
        f"{cls_name}Params", fields, frozen=True, namespace={"__doc__": doc}
    )


class FlowerPartitioner:
    """A Flower Datasets partitioner in fedsim's :class:`~fedsim.core.partition.Partitioner`
    shape; ``Params`` is read from the class's signature on first use."""

    def __init__(self, cls_name: str) -> None:
        self.cls_name = cls_name
        self.__doc__ = SUPPORTED[cls_name]

    @functools.cached_property
    def Params(self) -> type:  # the attribute every partitioner has
        return _params_class(self.cls_name)

    def __call__(
        self,
        labels: np.ndarray,
        num_clients: int,
        rng: np.random.Generator,
        params: Any,
        columns: Mapping[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """One index array per client; ``columns``: the dataset's extra per-sample columns."""
        return split(self.cls_name, labels, num_clients, rng, params, columns or {})


def _table(labels: np.ndarray, columns: Mapping[str, np.ndarray], order: np.ndarray) -> Any:
    datasets = offline_import("datasets")
    data: dict[str, Any] = {INDEX: order, LABEL: labels[order]}
    for name, values in columns.items():
        data[name] = np.asarray(values)[order]
    table = datasets.Dataset.from_dict({k: np.asarray(v).tolist() for k, v in data.items()})
    # Pandas-formatted, a column is one Series: Flower's np.array(dataset[column]) would
    # walk a plain Dataset's column row by row (seconds at 50,000 rows).
    return table.with_format("pandas")


def split(
    cls_name: str,
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    params: Any,
    columns: Mapping[str, np.ndarray],
) -> list[np.ndarray]:
    """``cls_name`` with ``params`` over the rows, shuffled by ``rng``; ``ValueError`` names
    what does not fit (a column the dataset lacks, a partition count that is not
    ``num_clients``)."""
    cls = flower_class(cls_name)
    kwargs = {
        f.name: list(v) if isinstance(v := getattr(params, f.name), tuple) else v
        for f in dataclasses.fields(params)
    }
    accepted = _signature(cls_name)
    if "num_partitions" in accepted:
        kwargs["num_partitions"] = num_clients
    if "seed" in accepted:
        kwargs["seed"] = int(rng.integers(2**31))
    available = [LABEL, *columns]
    by = kwargs.get("partition_by")
    if by is not None and by not in available:
        raise ValueError(
            f"partition-by = {by!r}: dataset has no such column; its columns: "
            + ", ".join(available)
        )
    order = rng.permutation(len(labels))
    try:
        partitioner = cls(**kwargs)
        partitioner.dataset = _table(labels, columns, order)
        count = partitioner.num_partitions
        if count != num_clients:
            raise ValueError(
                f"gives {count} partitions, federation.num-clients is {num_clients}; "
                "make them equal"
            )
        with contextlib.redirect_stderr(io.StringIO()):  # Flower's tqdm progress bars
            parts = [partitioner.load_partition(i)[INDEX] for i in range(num_clients)]
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"Flower Datasets' {cls_name}: {first_line(err)}") from None
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
