"""A component a scenario names, resolved once: its registered class and frozen parameters.

A scenario names components as tables (``{name = "dlg", steps = 300}``,
:class:`~fedsim.core.config.ComponentConfig`). Validation resolves each one
into a :class:`Resolved`: the class the registry holds and its ``Params``
dataclass with every default filled. Everything downstream (the runner, the
audit's tasks, the records) receives that, never the raw table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fedsim.core.config import ComponentConfig
from fedsim.core.registry import Registry
from fedsim.core.scenario_file import component_params, lookup
from fedsim.core.toml_tables import to_table

C = TypeVar("C")


@dataclass(frozen=True)
class Resolved(Generic[C]):
    """A named component: ``cls`` as registered, ``params`` its frozen ``cls.Params``."""

    name: str  # as the scenario gave it (an alias stays an alias in the records)
    cls: type[C]
    params: Any
    key: str  # where the scenario named it, e.g. "audit.attacks[0]"

    def table(self) -> dict[str, Any]:
        """Every parameter, defaults included, as a kebab-case table."""
        return dict(to_table(self.params))

    def params_text(self) -> str:
        """Every parameter as one line of JSON, an automatic choice (``None``) as ``null``:
        what ran, as the run's records say it."""
        return json.dumps(to_table(self.params, keep_none=True), separators=(", ", ": "))

    def create(self, **kwargs: Any) -> C:
        """An instance: ``cls(params, **kwargs)``."""
        return self.cls(self.params, **kwargs)  # type: ignore[call-arg]


def resolve(registry: Registry[Any], cfg: ComponentConfig, key: str) -> Resolved[Any]:
    """``cfg`` looked up in ``registry`` and its parameters checked; a one-line error else."""
    cls = lookup(registry, cfg.name, key)
    return Resolved(cfg.name, cls, component_params(cls, cfg, key), key)
