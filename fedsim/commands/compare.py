"""``fedsim compare SPEC [--out DIR] [--dry-run]``: a sweep, see :mod:`fedsim.sweeps`."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from fedsim.commands import COMMANDS
from fedsim.scenarios import scenario_path


class CompareCommand:
    help = "run a sweep of strategies x defences x seeds and write a privacy-utility report"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "spec", help="sweep spec TOML, or a shipped one by name (compare-table2)"
        )
        parser.add_argument(
            "--out", help="sweep folder (default: <base output.dir>/<spec name>); reruns resume"
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="validate the spec and list its runs (done or to do) without running",
        )

    def run(self, args: argparse.Namespace) -> int:
        from fedsim.outputs.run_folder import REPORT_FILE as HTML_REPORT
        from fedsim.simulation.lifecycle import RunInterrupted, signal_status
        from fedsim.sweeps.report import REPORT_FILE
        from fedsim.sweeps.runs import RUNS_DIR, is_finished, run_sweep
        from fedsim.sweeps.spec import check_machines, configurations, load_spec

        spec, base = load_spec(scenario_path(args.spec))
        configs = configurations(spec, base)
        out = Path(args.out) if args.out else Path(configs[0].scenario.output.dir) / spec.name
        console = Console(soft_wrap=True)
        if args.dry_run:
            check_machines(configs)
            for config in configs:
                done = is_finished(config, out / RUNS_DIR / config.path)
                console.print(f"{'done' if done else 'to run'}  {config.path}  ({config.label})")
            return 0
        try:
            outcome = run_sweep(spec, configs, out, console)
        except KeyboardInterrupt as stop:  # a run's RunInterrupted, or Ctrl-C between runs
            name = stop.signal_name if isinstance(stop, RunInterrupted) else "SIGINT"
            console.print(
                f"fedsim: interrupted ({name}); finished runs and completed rounds are saved: "
                f"continue with fedsim compare {args.spec} --out {out}",
                markup=False,
            )
            return signal_status(name)
        console.print(f"\nreport: {out / HTML_REPORT} (and {out / REPORT_FILE})")
        if outcome.failed:
            console.print(f"[red]{len(outcome.failed)} run(s) failed; rerun to retry them[/red]")
            return 1
        return 0


COMMANDS.register("compare")(CompareCommand())
