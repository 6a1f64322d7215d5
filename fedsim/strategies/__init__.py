"""Server-side strategies (Flower ``Strategy`` subclasses), found by name."""

from __future__ import annotations

from typing import Any

from fedsim.core.registry import Registry

STRATEGIES: Registry[Any] = Registry("strategy", ("fedsim.strategies",))
