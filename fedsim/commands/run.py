"""``fedsim run SCENARIO [--set key=value]... [--out DIR]`` and ``fedsim run --resume RUN_DIR``."""

from __future__ import annotations

import argparse
import sys

from fedsim.commands import COMMANDS
from fedsim.core.config import ScenarioError, require
from fedsim.core.scenario_file import load_scenario
from fedsim.scenarios import scenario_path


class RunCommand:
    help = "run a federation from a scenario file, or resume a stopped run"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "scenario",
            nargs="?",
            help="scenario TOML file, or a shipped one by name (fedsim list scenarios)",
        )
        parser.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a scenario key, e.g. --set federation.rounds=5 (repeatable)",
        )
        parser.add_argument("--out", help="run directory (default: <output.dir>/<name>-<time>)")
        parser.add_argument(
            "--force",
            action="store_true",
            help="run into an --out folder that holds files, replacing the run files in it",
        )
        parser.add_argument(
            "--resume",
            metavar="RUN_DIR",
            help="continue a stopped run after its last completed round, "
            "with the run directory's own scenario.toml",
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.resume:
            if args.scenario or args.overrides or args.out or args.force:
                raise ScenarioError(
                    "--resume",
                    args.resume,
                    "takes no scenario file, --set, --out or --force: the run continues "
                    "with its own scenario.toml in its own directory",
                )
        else:
            require(bool(args.scenario), "scenario", None, "give a file, or --resume RUN_DIR")
            # The file's form (TOML, keys, types, ranges) is checked before torch, Ray
            # and Flower are imported: a typo is refused in a fraction of a second.
            scenario = load_scenario(scenario_path(args.scenario), args.overrides)
        from fedsim.simulation.runner import RunFailed, run_scenario
        from fedsim.strategies.base import TooFewReplies

        try:
            if args.resume:
                from fedsim.simulation.resume import open_resume

                scenario, checkpoint = open_resume(args.resume)
                run_scenario(scenario, resume=checkpoint)
            else:
                run_scenario(scenario, args.out, force=args.force)
        except TooFewReplies as err:
            print(
                f"fedsim: error: {err}. Every completed round is checkpointed: "
                "continue with fedsim run --resume RUN_DIR",
                file=sys.stderr,
            )
            return 1
        except RunFailed as err:
            print(f"fedsim: error: {err}", file=sys.stderr)
            return 1
        return 0


COMMANDS.register("run")(RunCommand())
