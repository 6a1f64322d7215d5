"""The parameters of fedsim's own defences, attacks and leak analyses, importable without torch.

A scenario names these components by string with a table of parameters. Their
``Params`` dataclasses live here, in modules that import neither torch, Ray nor
Flower, so that :func:`fedsim.core.scenario_file.load_scenario` refuses an unknown
name or a value out of range in a fraction of a second, before the stack is imported.
Each component's class takes its ``Params`` from here; its registry checks that the
two agree when the class registers (a plugin's components keep theirs on the class
and are checked after the plugin is imported).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, TypeVar

from fedsim.core.errors import ScenarioError
from fedsim.core.toml_tables import parse_table

if TYPE_CHECKING:
    from fedsim.core.config import ComponentConfig

P = TypeVar("P", bound=type)


class Schemas:
    """One kind's parameter classes by registered name; ``group``: its plugins' entry
    points; ``modules``: where they are declared, imported on the first lookup."""

    def __init__(self, kind: str, group: str, modules: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.group = group
        self._modules = modules
        self._params: dict[str, type] = {}
        self._aliases: dict[str, str] = {}

    def register(self, *names: str, aliases: tuple[str, ...] = ()) -> Callable[[P], P]:
        """Decorator: ``names`` (and short ``aliases`` of the first) take the decorated
        dataclass as their ``Params``."""

        def decorator(params: P) -> P:
            self._params.update(dict.fromkeys(names, params))
            self._aliases.update(dict.fromkeys(aliases, names[0]))
            return params

        return decorator

    def _load(self) -> dict[str, type]:
        for module in self._modules:
            importlib.import_module(module)
        return self._params

    def get(self, name: str) -> type | None:
        """The ``Params`` of fedsim's component ``name`` or alias (``None``: not fedsim's own)."""
        return self._load().get(self._aliases.get(name, name))

    def names(self) -> list[str]:
        """fedsim's own components of this kind, sorted (without aliases)."""
        return sorted(self._load())

    def aliases(self) -> dict[str, str]:
        """Alias -> the name it stands for."""
        self._load()
        return dict(self._aliases)

    def check(self, configs: Sequence[ComponentConfig], key: str, plugins: bool) -> None:
        """Each of ``configs`` (listed at ``key``) names a component of this kind with valid
        parameters; a name fedsim lacks passes only where ``plugins`` or an installed
        plugin may register it (then it is checked after their import)."""
        may_extend = plugins or bool(entry_points(group=self.group))
        for i, cfg in enumerate(configs):
            params = self.get(cfg.name)
            if params is not None:
                parse_table(params, cfg.params, f"{key}[{i}]")
            elif not may_extend:
                raise ScenarioError(f"{key}[{i}]", cfg.name, f"allowed: {', '.join(self.names())}")
