"""CLI subcommands: one module each, registered in :data:`COMMANDS`."""

from __future__ import annotations

import argparse
from importlib.resources import files
from pathlib import Path
from typing import Protocol

from fedsim.core.registry import Registry


class Command(Protocol):
    """A ``fedsim`` subcommand."""

    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


COMMANDS: Registry[Command] = Registry("command", ("fedsim.commands",))


def shipped_scenarios() -> list[str]:
    """Names of the scenario files shipped with fedsim (``quickstart``, ...)."""
    folder = files("fedsim.scenarios")
    return sorted(
        p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")
    )


def scenario_path(given: str) -> Path:
    """``given`` if it is a file, else the shipped scenario it names: ``quickstart``,
    ``quickstart.toml`` or ``scenarios/quickstart.toml`` work from any folder.
    A name that is neither is returned as is (reading it gives the error)."""
    path = Path(given)
    if path.is_file():
        return path
    shipped = files("fedsim.scenarios") / f"{path.name.removesuffix('.toml')}.toml"
    return Path(str(shipped)) if shipped.is_file() else path
