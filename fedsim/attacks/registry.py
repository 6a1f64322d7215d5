"""The registry of attacks: its modules register into it, scenarios look names up in it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fedsim.attacks.base import Attack
from fedsim.core.components import Resolved, resolve
from fedsim.core.config import ComponentConfig
from fedsim.core.params.attacks import ATTACK_PARAMS
from fedsim.core.registry import Registry

ATTACKS: Registry[Any] = Registry(
    "attack",
    ("fedsim.attacks.reconstruction",),
    group="fedsim.attacks",
    subclass_of=Attack,
    needs=("Params",),
    params=ATTACK_PARAMS,
)


def resolve_attack(
    name: str, params: Mapping[str, Any] | None = None, key: str = "attack"
) -> Resolved[Any]:
    """The attack registered as ``name`` with ``params`` (a kebab-case table), resolved:
    unknown keys and bad values raise :class:`~fedsim.core.config.ScenarioError` naming
    ``key.<field>``; absent keys keep the paper's defaults."""
    return resolve(ATTACKS, ComponentConfig(name, dict(params or {})), key)


def create_attack(
    name: str,
    params: Mapping[str, Any] | None = None,
    device: torch.device | str = "cpu",
    key: str = "attack",
) -> Attack:
    """The attack registered as ``name`` with ``params``, a kebab-case table.

    The table is validated strictly against the attack's ``Params`` (unknown
    keys and bad values raise :class:`~fedsim.core.config.ScenarioError` naming
    ``key.<field>``); absent keys keep the paper's defaults.
    """
    attack: Attack = resolve_attack(name, params, key).create(device=torch.device(device))
    return attack
