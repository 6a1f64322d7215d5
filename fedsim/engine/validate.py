"""Resolving the components a scenario names, and validating them up front.

Everything here runs before Ray starts, so bad input costs nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from fedsim.core.config import ComponentConfig, Scenario, ScenarioError, parse_table
from fedsim.core.registry import Registry, UnknownNameError


def component_params(component: Any, cfg: ComponentConfig, key: str) -> Any:
    """Validate ``cfg.params`` against ``component.Params`` (a frozen dataclass)."""
    return parse_table(component.Params, cfg.params, key)


def lookup(registry: Registry[Any], name: str, key: str) -> Any:
    """Registry lookup that reports the scenario key on failure."""
    try:
        return registry.get(name)
    except UnknownNameError:
        raise ScenarioError(key, name, f"allowed: {', '.join(registry.names())}") from None


def check_gpu_request(num_gpus: float, key: str) -> None:
    """Ray waits forever for GPUs that do not exist; refuse instead."""
    if num_gpus > 0 and not torch.cuda.is_available():
        raise ScenarioError(key, num_gpus, "must be 0 on a machine without a CUDA GPU")


def validate_scenario(scenario: Scenario) -> None:
    """Check every name and parameter a scenario gives; raise :class:`ScenarioError`."""
    from fedsim.core.data import DATASETS, check_dataset_available
    from fedsim.core.models import INITS, MODELS
    from fedsim.core.partition import PARTITIONERS
    from fedsim.strategies import STRATEGIES

    lookup(DATASETS, scenario.data.dataset, "data.dataset")
    lookup(MODELS, scenario.model.name, "model.name")
    lookup(INITS, scenario.model.init, "model.init")
    partitioner = lookup(PARTITIONERS, scenario.data.partitioner.name, "data.partitioner")
    component_params(partitioner, scenario.data.partitioner, "data.partitioner")
    strategy = lookup(STRATEGIES, scenario.strategy.name, "strategy")
    component_params(strategy, scenario.strategy, "strategy")
    strategy.check_scenario(scenario)
    check_gpu_request(scenario.backend.num_gpus, "backend.num-gpus")
    if scenario.defences:
        from fedsim.clients.defences import check_defences

        check_defences(scenario)
    if scenario.audit.enabled:
        from fedsim.attacks import ATTACKS

        for i, attack in enumerate(scenario.audit.attacks):
            key = f"audit.attacks[{i}]"
            component_params(lookup(ATTACKS, attack.name, key), attack, key)
        check_gpu_request(scenario.audit.num_gpus, "audit.num-gpus")
    check_dataset_available(scenario.data)
