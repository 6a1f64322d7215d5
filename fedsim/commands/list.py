"""``fedsim list [KIND]``: registered components with a line each and where each comes from
(``fedsim``, or a plugin's distribution or module), and the shipped scenarios.

Plugins installed as entry points are listed; a scenario's ``plugins`` key is not
read here (set ``FEDSIM_PLUGINS`` to list those, :mod:`fedsim.core.plugins`)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from fedsim.commands import COMMANDS
from fedsim.core.config import ScenarioError
from fedsim.scenarios import shipped_scenarios

KINDS = (
    "strategies",
    "attacks",
    "leaks",
    "defences",
    "datasets",
    "partitioners",
    "models",
    "inits",
    "scenarios",
)


def _registries() -> dict[str, Any]:
    from fedsim.attacks import ATTACKS
    from fedsim.attacks.leakage import LEAKS
    from fedsim.clients.defences import DEFENCES
    from fedsim.core.data import DATASETS
    from fedsim.core.models import INITS, MODELS
    from fedsim.core.partition import PARTITIONERS
    from fedsim.strategies import STRATEGIES

    return {
        "strategies": STRATEGIES,
        "attacks": ATTACKS,
        "leaks": LEAKS,
        "defences": DEFENCES,
        "datasets": DATASETS,
        "partitioners": PARTITIONERS,
        "models": MODELS,
        "inits": INITS,
    }


def _modality(kind: str, component: Any) -> str:
    """The modality a dataset, model, attack, leak analysis or strategy is for (``any``: every
    one); blank for the kinds that do not declare one."""
    from fedsim.core.modality import ANY, IMAGE, modality_of

    defaults = {
        "datasets": IMAGE,
        "models": IMAGE,
        "attacks": IMAGE,
        "leaks": IMAGE,
        "strategies": ANY,
    }
    return modality_of(component, defaults[kind]) if kind in defaults else ""


def _scenario_description(name: str) -> str:
    import tomllib
    from importlib.resources import files

    raw = tomllib.loads((files("fedsim.scenarios") / f"{name}.toml").read_text())
    return str(raw.get("description", ""))


def _description(kind: str, registry: Any, name: str) -> str:
    # A leak analysis says which kind of leak it estimates (its verdict's column).
    if kind == "leaks":
        return f"{registry.get(name).kind}: {registry.describe(name).strip()}"
    return str(registry.describe(name))


class ListCommand:
    help = (
        "list strategies, attacks, leak analyses, defences, datasets, partitioners, models, "
        "inits, scenarios"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "kind", nargs="?", help=f"only this kind: {', '.join(KINDS)} (default: all)"
        )

    def run(self, args: argparse.Namespace) -> int:
        kinds: tuple[str, ...] = KINDS
        if args.kind:
            # "strategy" and "strategies" both work
            chosen = [k for k in KINDS if args.kind in (k, k.removesuffix("s"), k[:-3] + "y")]
            if not chosen:
                raise ScenarioError("KIND", args.kind, ", ".join(KINDS))
            kinds = tuple(chosen)
        registries = _registries()
        table = Table("kind", "name", "modality", "from", "what it is", show_lines=False)
        for column in table.columns:
            column.overflow = "fold"  # wrap long cells instead of cutting them off
        for kind in kinds:
            if kind == "scenarios":
                for name in shipped_scenarios():
                    table.add_row(kind, name, "", "fedsim", _scenario_description(name))
                continue
            registry = registries[kind]
            for name in registry.names():
                shown = _modality(kind, registry.get(name))
                description = _description(kind, registry, name)
                table.add_row(kind, name, shown, registry.origin(name), description)
        Console().print(table)
        return 0


COMMANDS.register("list")(ListCommand())
