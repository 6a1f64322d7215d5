"""``fedsim report DIR``: (re)write ``report.html`` for a run or a ``fedsim compare`` folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedsim.commands import COMMANDS
from fedsim.core.config import ScenarioError


class ReportCommand:
    help = "write report.html (curves, audit, reconstructions) for a run or a compare folder"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dir", help="a run directory, or a fedsim compare output folder")

    def run(self, args: argparse.Namespace) -> int:
        from fedsim.outputs.report import write_run_report
        from fedsim.outputs.run_folder import METRICS_FILE, SCENARIO_FILE
        from fedsim.sweeps.report import SWEEP_FILE, write_sweep_report

        folder = Path(args.dir)
        if (folder / SWEEP_FILE).is_file():
            path = write_sweep_report(folder)
        elif (folder / SCENARIO_FILE).is_file() or (folder / METRICS_FILE).is_file():
            path = write_run_report(folder)
        else:
            raise ScenarioError(
                "DIR",
                str(folder),
                f"a run directory (with {SCENARIO_FILE}) or a compare folder (with {SWEEP_FILE})",
            )
        print(f"report: {path} (open it in a browser: file://{path.resolve()})")
        return 0


COMMANDS.register("report")(ReportCommand())
