"""The registry of attacks: its modules register into it, scenarios look names up in it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedsim.core.components import Resolved, resolve
from fedsim.core.config import ComponentConfig
from fedsim.core.registry import Registry

ATTACKS: Registry[Any] = Registry("attack", ("fedsim.attacks",))


def resolve_attack(
    name: str, params: Mapping[str, Any] | None = None, key: str = "attack"
) -> Resolved[Any]:
    """The attack registered as ``name`` with ``params`` (a kebab-case table), resolved:
    unknown keys and bad values raise :class:`~fedsim.core.config.ScenarioError` naming
    ``key.<field>``; absent keys keep the paper's defaults."""
    return resolve(ATTACKS, ComponentConfig(name, dict(params or {})), key)
