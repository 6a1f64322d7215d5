"""Flower's own strategies by name (FedAdam, FedYogi, FedAdagrad, FedAvgM, Krum, ...).

One adapter for all of them: :func:`flower_strategy` reads the Flower class's
constructor signature, turns its hyper-parameters (every argument with a
number, string or flag default, except Flower's sampling options and record
keys, which the engine decides) into a frozen ``Params`` dataclass checked
like every other component's (kebab-case keys, types, and the Flower
constructor's own checks, before Ray starts), and registers a class that is
the Flower strategy with fedsim's FedAvg services on top: seeded sampling by
partition id, evaluation on the held-out set, the failure threshold, the
audit, and checkpoints of the server optimiser's state. Each one keeps
Flower's aggregation exactly (FedOpt's server optimiser, Krum's selection,
the coordinate-wise median or trimmed mean).

Message contract: FedAvg's (:class:`fedsim.strategies.fedavg.FedAvg`), answered
by the ``fedavg`` client routine.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import numpy as np
import torch
from flwr.serverapp import strategy as flower

from fedsim.core.config import ScenarioError
from fedsim.strategies.fedavg import FedAvg
from fedsim.strategies.registry import STRATEGIES

ENGINE_DECIDES = frozenset(
    {
        "fraction_train",
        "fraction_evaluate",
        "min_train_nodes",
        "min_evaluate_nodes",
        "min_available_nodes",
        "weighted_by_key",
        "arrayrecord_key",
        "configrecord_key",
        "train_metrics_aggr_fn",
        "evaluate_metrics_aggr_fn",
    }
)
"""Flower constructor arguments a scenario does not set: sampling, record keys, metric hooks."""

SIMPLE = (bool, int, float, str)

SERVER_STATE = ("m_t", "v_t", "momentum_vector")
"""Flower's server-optimiser state (FedOpt's moments, FedAvgM's momentum), checkpointed."""


def _tensors(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: torch.from_numpy(np.array(v)) for k, v in value.items()}
    return [torch.from_numpy(np.array(v)) for v in value]


def _arrays(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v.numpy() for k, v in value.items()}
    return [v.numpy() for v in value]


def state_for_checkpoint(self: FedAvg) -> dict[str, Any]:
    """The server optimiser's state, so a resumed run continues it."""
    present = {name: getattr(self, name, None) for name in SERVER_STATE}
    return {name: _tensors(value) for name, value in present.items() if value is not None}


def restore_checkpoint_state(self: FedAvg, state: dict[str, Any]) -> None:
    for name, value in state.items():
        setattr(self, name, _arrays(value))


def _hyper_parameters(flower_cls: type[Any]) -> list[tuple[str, type, Any]]:
    try:
        hints = typing.get_type_hints(flower_cls.__init__)
    except (NameError, TypeError):
        hints = {}
    found = []
    for name, param in inspect.signature(flower_cls).parameters.items():
        if name in ENGINE_DECIDES or not isinstance(param.default, SIMPLE):
            continue
        hint = hints.get(name)
        found.append((name, hint if hint in SIMPLE else type(param.default), param.default))
    return found


def params_class(flower_cls: type) -> type:
    """A frozen dataclass of ``flower_cls``'s hyper-parameters, validated by Flower itself."""

    def __post_init__(self: Any) -> None:
        try:
            flower_cls(**dataclasses.asdict(self))
        except (ValueError, AssertionError) as err:
            shown = {k.replace("_", "-"): v for k, v in dataclasses.asdict(self).items()}
            raise ScenarioError("strategy", shown, str(err)) from None

    return dataclasses.make_dataclass(
        f"{flower_cls.__name__}Params",
        _hyper_parameters(flower_cls),
        frozen=True,
        namespace={"__post_init__": __post_init__, "__module__": __name__},
    )


def flower_strategy(name: str, flower_cls: type, weighted_mean: bool) -> type[FedAvg]:
    """Register Flower's ``flower_cls`` as strategy ``name``, with fedsim's services;
    ``weighted_mean``: whether it reads the replies only through their weighted mean
    (a server optimiser on it), not one by one (a robust aggregator)."""
    params = params_class(flower_cls)
    fields = {f.name for f in dataclasses.fields(params)}

    def __init__(self: FedAvg, **options: Any) -> None:
        FedAvg.__init__(self, **options)
        self.params = params(**{k: v for k, v in options.items() if k in fields})

    cls = type(
        flower_cls.__name__,
        (FedAvg, flower_cls),
        {
            "__init__": __init__,
            "state_for_checkpoint": state_for_checkpoint,
            "restore_checkpoint_state": restore_checkpoint_state,
            "__module__": __name__,
            "__doc__": f"Flower's ``{flower_cls.__name__}`` with fedsim's metrics and hooks.",
            "Params": params,
            "client_routine": "fedavg",
            "weighted_mean": weighted_mean,
            "plain_mean": False,  # a server optimiser or a robust aggregate
        },
    )
    return STRATEGIES.register(name)(cls)


FedAdam = flower_strategy("fedadam", flower.FedAdam, weighted_mean=True)
FedYogi = flower_strategy("fedyogi", flower.FedYogi, weighted_mean=True)
FedAdagrad = flower_strategy("fedadagrad", flower.FedAdagrad, weighted_mean=True)
FedAvgM = flower_strategy("fedavgm", flower.FedAvgM, weighted_mean=True)
FedTrimmedAvg = flower_strategy("fedtrimmedavg", flower.FedTrimmedAvg, weighted_mean=False)
Krum = flower_strategy("krum", flower.Krum, weighted_mean=False)
FedMedian = flower_strategy("fedmedian", flower.FedMedian, weighted_mean=False)
