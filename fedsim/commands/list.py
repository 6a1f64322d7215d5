"""``fedsim list``: every registered component and the shipped scenarios."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fedsim.commands import COMMANDS

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"


def _first_line(obj: object) -> str:
    return ((obj.__doc__ or "").strip().splitlines() or [""])[0]


class ListCommand:
    help = "list strategies, attacks, defences, datasets, partitioners, models, inits and scenarios"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        from fedsim.attacks import ATTACKS
        from fedsim.clients.defences import DEFENCES
        from fedsim.core.data import DATASETS
        from fedsim.core.models import INITS, MODELS
        from fedsim.core.partition import PARTITIONERS
        from fedsim.strategies import STRATEGIES

        table = Table("kind", "name", "what it is")
        for kind, registry in (
            ("strategy", STRATEGIES),
            ("attack", ATTACKS),
            ("defence", DEFENCES),
            ("dataset", DATASETS),
            ("partitioner", PARTITIONERS),
            ("model", MODELS),
            ("init", INITS),
        ):
            for name in registry.names():
                table.add_row(kind, name, _first_line(registry.get(name)))
        for path in sorted(SCENARIO_DIR.glob("*.toml")):
            table.add_row("scenario", f"scenarios/{path.name}", "")
        Console().print(table)
        return 0


COMMANDS.register("list")(ListCommand())
