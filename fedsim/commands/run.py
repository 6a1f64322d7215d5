"""``fedsim run SCENARIO [--set key=value]... [--out DIR]``."""

from __future__ import annotations

import argparse

from fedsim.commands import COMMANDS
from fedsim.config import load_scenario


class RunCommand:
    help = "run a federation from a scenario file"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("scenario", help="scenario TOML file (see scenarios/)")
        parser.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a scenario key, e.g. --set federation.rounds=5 (repeatable)",
        )
        parser.add_argument("--out", help="run directory (default: <output.dir>/<name>-<time>)")

    def run(self, args: argparse.Namespace) -> int:
        from fedsim.runner import run_scenario

        scenario = load_scenario(args.scenario, args.overrides)
        run_scenario(scenario, args.out)
        return 0


COMMANDS.register("run")(RunCommand())
