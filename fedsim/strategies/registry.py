"""The registry of strategies: its modules register into it, scenarios look names up in it."""

from __future__ import annotations

from typing import Any

from fedsim.core.registry import Registry
from fedsim.strategies.base import EngineHooks

STRATEGIES: Registry[Any] = Registry(
    "strategy",
    ("fedsim.strategies",),
    group="fedsim.strategies",
    subclass_of=EngineHooks,
    needs=("Params", "client_routine"),
)
