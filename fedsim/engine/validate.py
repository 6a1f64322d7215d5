"""Is a well-formed scenario runnable? Checked before Ray starts, so bad input costs nothing.

:func:`fedsim.core.config.load_scenario` checks a scenario's form (keys, types,
ranges). Here, in two steps:

- :func:`check_components`: every name a scenario gives is registered, every
  component's parameters are valid, and the components fit together
  (strategy, defences, attacks). Needs no data and no hardware.
- :func:`check_machine`: this machine can run it (dataset files present,
  GPUs where GPUs are asked for).
"""

from __future__ import annotations

import torch

from fedsim.attacks import ATTACKS
from fedsim.clients.defences import check_defences
from fedsim.core.config import ComponentConfig, Scenario, ScenarioError, component_params, lookup
from fedsim.core.data import DATASETS, check_dataset_available
from fedsim.core.models import INITS, MODELS
from fedsim.core.partition import PARTITIONERS
from fedsim.engine.resources import test_logical_gpus
from fedsim.strategies import STRATEGIES


def check_attack(attack: ComponentConfig, key: str) -> None:
    """The attack is registered and its parameters are valid."""
    component_params(lookup(ATTACKS, attack.name, key), attack, key)


def check_components(scenario: Scenario) -> None:
    """Every name and parameter the scenario gives; raise :class:`ScenarioError`."""
    lookup(DATASETS, scenario.data.dataset, "data.dataset")
    lookup(MODELS, scenario.model.name, "model.name")
    lookup(INITS, scenario.model.init, "model.init")
    partitioner = lookup(PARTITIONERS, scenario.data.partitioner.name, "data.partitioner")
    component_params(partitioner, scenario.data.partitioner, "data.partitioner")
    strategy = lookup(STRATEGIES, scenario.strategy.name, "strategy")
    component_params(strategy, scenario.strategy, "strategy")
    strategy.check_scenario(scenario)
    check_defences(scenario)
    if scenario.audit.enabled:
        for i, attack in enumerate(scenario.audit.attacks):
            check_attack(attack, f"audit.attacks[{i}]")


def check_gpu_request(num_gpus: float, key: str) -> None:
    """Ray waits forever for GPUs that do not exist; refuse instead.

    Tests alone may grant logical GPUs (:data:`~fedsim.engine.resources.TEST_LOGICAL_GPUS_ENV`):
    Ray then schedules GPU shares and everything runs on CPU.
    """
    if num_gpus > 0 and not torch.cuda.is_available() and not test_logical_gpus():
        raise ScenarioError(key, num_gpus, "must be 0 on a machine without a CUDA GPU")


def check_machine(scenario: Scenario) -> None:
    """This machine can run ``scenario``: its data is here, its GPUs exist."""
    check_gpu_request(scenario.backend.num_gpus, "backend.num-gpus")
    if scenario.audit.enabled:
        check_gpu_request(scenario.audit.num_gpus, "audit.num-gpus")
    check_dataset_available(scenario.data)


def validate(scenario: Scenario) -> Scenario:
    """:func:`check_components` then :func:`check_machine`; returns ``scenario``."""
    check_components(scenario)
    check_machine(scenario)
    return scenario
