"""Running a sweep: each configuration's run, resumed or skipped when a rerun finds it.

Runs: ``parallel = 1`` runs the configurations one after another in this
process (one Ray start each; on 2 cores a run already uses both).
``parallel = N`` runs N at once, each as ``fedsim run`` in a subprocess with
its own Ray (give the base ``backend.ray-cpus`` so they share the machine); a
Ctrl-C to the sweep stops each at its round end, and a sweep killed outright
takes its runs with it (:class:`fedsim.simulation.children.ChildRuns`).

Resume: each run lives in ``<out>/runs/<configuration>/seed-<k>``; when it
ends, a marker (``compare.json``: the hash of its resolved scenario) is
written. A rerun skips runs whose marker matches; a run without one
(interrupted, even by SIGKILL) continues from its last checkpoint when its
``scenario.toml`` is the configuration's (as ``fedsim run --resume``), and
starts over when it has no usable checkpoint or its configuration changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd
import tomli_w
from rich.console import Console

from fedsim.core.config import Scenario, ScenarioError
from fedsim.core.scenario_file import scenario_to_dict
from fedsim.outputs.run_folder import CHECKPOINT_DIR, METRICS_FILE, SCENARIO_FILE, unlock_run_dir
from fedsim.simulation.checkpoint import checkpointed_round
from fedsim.simulation.children import ChildRuns
from fedsim.simulation.lifecycle import STOP_STATUSES, RaySession, RunInterrupted, reap_orphans
from fedsim.simulation.resume import open_resume
from fedsim.sweeps.report import write_outputs
from fedsim.sweeps.spec import CompareSpec, Configuration, check_machines
from fedsim.sweeps.table import collect_attacks, collect_results, summarise

RUNS_DIR = "runs"
MARKER = "compare.json"


def scenario_hash(scenario: Scenario) -> str:
    """A short hash of the resolved scenario: a finished run is reused only for the same one."""
    return hashlib.sha256(tomli_w.dumps(scenario_to_dict(scenario)).encode()).hexdigest()[:16]


def is_finished(config: Configuration, run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a completed run of exactly ``config``'s scenario
    with the outputs the table reads (a run missing one is done again)."""
    marker = run_dir / MARKER
    if run_dir.is_symlink() or marker.is_symlink() or not marker.is_file():
        return False
    if not (run_dir / METRICS_FILE).is_file():
        return False
    try:
        record = json.loads(marker.read_text())
    except (ValueError, UnicodeDecodeError):  # damaged: the run is done again
        return False
    return isinstance(record, dict) and record.get("scenario") == scenario_hash(config.scenario)


def mark_finished(config: Configuration, run_dir: Path) -> None:
    record = {
        "label": config.label,
        "seed": config.seed,
        "scenario": scenario_hash(config.scenario),
    }
    tmp = run_dir / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, run_dir / MARKER)  # a kill mid-write leaves no half marker


def resumable(config: Configuration, run_dir: Path, console: Console) -> bool:
    """Whether the stopped run in ``run_dir`` is ``config``'s and has a checkpoint to go on from."""
    if not (run_dir / SCENARIO_FILE).is_file() or not (run_dir / CHECKPOINT_DIR).is_dir():
        return False  # stopped before its first round ended: nothing to continue
    try:
        scenario, checkpoint = open_resume(run_dir)
    except ScenarioError as err:  # damaged or changed: the run is done again
        console.print(f"[yellow]{config.path} cannot continue ({err})[/yellow]")
        return False
    finally:
        unlock_run_dir(run_dir)  # the run itself takes the lock, maybe in another process
    if scenario_hash(scenario) != scenario_hash(config.scenario):
        return False
    console.print(f"continuing {config.path} after round {checkpoint.round}")
    return True


class RunFn(Protocol):
    """Runs one configuration into ``run_dir``; ``resume``: continue the run already there."""

    def __call__(
        self, scenario: Scenario, run_dir: Path, console: Console, resume: bool
    ) -> None: ...


def run_in_process(scenario: Scenario, run_dir: Path, console: Console, resume: bool) -> None:
    """One run in this process (Ray starts and stops inside it)."""
    from fedsim.simulation.runner import run_scenario

    if resume:
        scenario, checkpoint = open_resume(run_dir)
        run_scenario(scenario, console=console, resume=checkpoint)
    else:
        run_scenario(scenario, run_dir, console)


@dataclass
class SubprocessRuns:
    """Runs each configuration as ``fedsim run`` in its own process (a :class:`RunFn`);
    its output goes to ``<run_dir>.log``. A run stopped by a signal raises
    :class:`RunInterrupted`, one that failed ``CalledProcessError``."""

    children: ChildRuns = field(default_factory=ChildRuns)

    def __call__(self, scenario: Scenario, run_dir: Path, console: Console, resume: bool) -> None:
        command = [sys.executable, "-m", "fedsim.cli", "run"]
        if resume:
            command += ["--resume", str(run_dir)]
        else:
            scenario_file = run_dir.with_suffix(".toml")
            scenario_file.write_text(tomli_w.dumps(scenario_to_dict(scenario)))
            command += [str(scenario_file), "--out", str(run_dir)]
        with run_dir.with_suffix(".log").open("a" if resume else "w") as log:
            status = self.children.run(command, log)
        if status in (*STOP_STATUSES, -signal.SIGTERM, -signal.SIGINT):
            raise RunInterrupted("signal", run_dir, checkpointed_round(run_dir) or 0)
        if status:
            raise subprocess.CalledProcessError(status, command)
        console.print(f"finished {run_dir} (log: {run_dir.with_suffix('.log')})")


@dataclass
class SweepOutcome:
    """What a sweep did and where its outputs are."""

    out: Path
    ran: list[Configuration]
    skipped: list[Configuration]
    failed: dict[str, str]
    results: pd.DataFrame
    table: pd.DataFrame


def triage(
    configs: list[Configuration], runs: Path, console: Console
) -> tuple[list[Configuration], list[Configuration], set[Path]]:
    """What to run (in spec order), what is already done, and which runs to continue.

    A run folder that can neither be skipped nor continued is removed: it starts over.
    """
    todo, skipped, resumed = [], [], set()
    for config in configs:
        run_dir = runs / config.path
        if is_finished(config, run_dir):
            skipped.append(config)
            continue
        if run_dir.is_symlink():  # a sweep folder is data: the link goes, not its target
            run_dir.unlink()
        elif resumable(config, run_dir, console):
            resumed.add(config.path)
        elif run_dir.exists():  # no checkpoint, or run with another configuration
            console.print(f"[yellow]starting {config.path} over[/yellow]")
            shutil.rmtree(run_dir)
        todo.append(config)
    return todo, skipped, resumed


def run_sweep(
    spec: CompareSpec,
    configs: list[Configuration],
    out: Path,
    console: Console | None = None,
    run: RunFn | None = None,
) -> SweepOutcome:
    """Run every unfinished configuration, then write the table, plot and report.

    A run that raises is reported in ``failed`` and left out of the table;
    the others go on.
    """
    console = console or Console(soft_wrap=True)
    check_machines(configs)
    # A killed sweep's child runs hold their folders' locks: end them before looking.
    reap_orphans()
    run = run or (run_in_process if spec.parallel == 1 else SubprocessRuns())
    runs = out / RUNS_DIR
    todo, skipped, resumed = triage(configs, runs, console)
    console.print(
        f"[bold]fedsim compare[/bold] {spec.name}: {len(configs)} runs, "
        f"{len(skipped)} already done, {len(todo)} to run ({len(resumed)} continuing) -> {out}"
    )
    failed: dict[str, str] = {}

    def one(config: Configuration) -> None:
        run_dir = runs / config.path
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        console.print(f"[bold]{config.label}[/bold], seed {config.seed}")
        try:
            run(config.scenario, run_dir, console, resume=config.path in resumed)
        except Exception as err:  # one failed run should not cost the others
            failed[str(config.path)] = f"{type(err).__name__}: {err}"
            console.print(f"[red]{config.path} failed: {failed[str(config.path)]}[/red]")
            return
        mark_finished(config, run_dir)

    if spec.parallel == 1:
        for config in todo:
            one(config)
    else:
        run_parallel(one, todo, spec.parallel, run)
    done = [c for c in configs if is_finished(c, runs / c.path)]
    results = collect_results(done, runs, spec.accuracy, spec.success_psnr)
    table = summarise(results, collect_attacks(done, runs), spec.success_psnr)
    write_outputs(spec, results, table, failed, out)
    ran = [c for c in todo if str(c.path) not in failed]
    return SweepOutcome(out, ran, skipped, failed, results, table)


def run_parallel(
    one: Callable[[Configuration], None], todo: list[Configuration], parallel: int, run: RunFn
) -> None:
    """``one`` for each configuration, ``parallel`` at a time.

    The sweep's session file lists its child runs (and their Ray) for the next
    run to reap if this process is killed. On Ctrl-C, each running child is
    asked to stop at its round end, once, and waited for; queued ones never start.
    """
    children = run.children if isinstance(run, SubprocessRuns) else ChildRuns()
    pool = ThreadPoolExecutor(parallel)
    # A killed sweep's child runs stop at their round end (SIGTERM from the kernel);
    # each run's own reaper takes its Ray processes.
    with RaySession(scan=children.processes, reap_on_death=False).watching():
        try:
            list(pool.map(one, todo))
        except KeyboardInterrupt:
            children.interrupt()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
