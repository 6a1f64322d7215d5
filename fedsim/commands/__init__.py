"""CLI subcommands: one module each, registered in :data:`COMMANDS`."""

from __future__ import annotations

import argparse
from typing import Protocol

from fedsim.core.registry import Registry


class Command(Protocol):
    """A ``fedsim`` subcommand."""

    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


COMMANDS: Registry[Command] = Registry("command", ("fedsim.commands",))
