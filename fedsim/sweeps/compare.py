"""``fedsim compare``: a privacy-utility sweep from one spec file.

Users weigh accuracy against leakage; FedCG's Table 2 is the model. A spec
names a base scenario and the axes of a sweep, strategies x defences x seeds.
Each configuration is the base with overrides: the spec's, the strategy
entry's, the defence entry's, then the seed (``federation.seed`` and
``audit.seed``). Every configuration's scenario is validated before anything
runs.

Spec (TOML)::

    name = "table2"
    description = "..."
    base = "audit-fedavg.toml"   # a scenario file (relative to the spec), or a [base] table
    overrides = { federation.rounds = 5 }   # changes to the base for every configuration
    seeds = [0, 1]
    parallel = 1                 # runs at once; > 1: each run in its own process and Ray
    accuracy = "auto"            # or "test-acc" / "client-eval-acc" for every row
    success-psnr = 20.0          # an attack succeeds at this PSNR (dB, peak 1) or above

    [[strategies]]               # default: the base's strategy
    label = "FedAvg"
    strategy = "fedavg"          # or {name = "fedprox", mu = 0.01}
    overrides = { client.lr = 0.01 }   # any scenario keys; tables merge key by key

    [[defences]]                 # default: none
    label = "DP sigma=0.1"
    chain = [{name = "gaussian", sigma = 0.1}]   # the scenario's [[defences]]
    strategies = ["FedAvg"]      # only with these strategy labels (default: all)

Runs: ``parallel = 1`` runs the configurations one after another in this
process (one Ray start each; on 2 cores a run already uses both).
``parallel = N`` runs N at once, each as ``fedsim run`` in a subprocess with
its own Ray (give the base ``backend.ray-cpus`` so they share the machine); a
Ctrl-C to the sweep stops each at its round end, and a sweep killed outright
takes its runs with it (:class:`fedsim.simulation.lifecycle.ChildRuns`).

Resume: each run lives in ``<out>/runs/<configuration>/seed-<k>``; when it
ends, a marker (``compare.json``: the hash of its resolved scenario) is
written. A rerun skips runs whose marker matches; a run without one
(interrupted, even by SIGKILL) continues from its last checkpoint when its
``scenario.toml`` is the configuration's (as ``fedsim run --resume``), and
starts over when it has no usable checkpoint or its configuration changed.

Outputs in ``<out>``: ``results.csv`` (one row per run and attack),
``table.csv`` and ``table.md`` (mean and std over seeds per configuration),
``privacy-utility.png`` (accuracy against audit PSNR) and ``report.md``.
Accuracy is the final round's: ``test-acc`` (the global model on the held-out
test set) where the run has one, else ``client-eval-acc`` (personalised: each
client's model on its local test split, mean over clients; FedSplit, FedCG and
local have no global model). Audit columns are means over every audited
(round, victim) of the run, non-finite PSNRs left out as the auditor does. A
mean hides a split (3.3 and 54.7 dB average to 29 dB), so the table also gives
the median and max PSNR and the share of attacks at or above ``success-psnr``,
over every attack of every seed. A run that ran more than one attack (the
``"auto"`` portfolio) also gets a ``verdict`` row, first: the same statistics
over its victims' verdicts (per victim the best of its attacks, ``verdict.csv``).
``seconds`` is each run's true wall time.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import pandas as pd
import tomli_w
from matplotlib.figure import Figure
from rich.console import Console

from fedsim.core import protocol
from fedsim.core.config import (
    Scenario,
    ScenarioError,
    parse_table,
    read_toml,
    require,
    require_file_name,
    require_seed,
    scenario_from_dict,
    scenario_to_dict,
)
from fedsim.core.protocol import AuditRecord
from fedsim.outputs.run_folder import (
    AUDIT_FILE,
    CHECKPOINT_DIR,
    METRICS_FILE,
    SCENARIO_FILE,
    SUMMARY_FILE,
    read_wall_seconds,
    unlock_run_dir,
)
from fedsim.outputs.run_folder import REPORT_FILE as RUN_REPORT_FILE
from fedsim.outputs.tables import DEFAULT_SUCCESS_PSNR, leakage_stats, mean_std_text, number_text
from fedsim.outputs.verdict import victim_verdicts
from fedsim.scenario.validate import check_components, check_machine
from fedsim.simulation.checkpoint import checkpointed_round, open_resume
from fedsim.simulation.lifecycle import (
    INTERRUPTED_STATUS,
    ChildRuns,
    RaySession,
    RunInterrupted,
    reap_orphans,
)

RUNS_DIR = "runs"
MARKER = "compare.json"
RESULTS_FILE = "results.csv"
TABLE_CSV = "table.csv"
TABLE_MD = "table.md"
PLOT_FILE = "privacy-utility.png"
REPORT_FILE = "report.md"
SWEEP_FILE = "sweep.json"  # the spec's name, description and threshold, for fedsim report
SCORES = ("accuracy", "psnr", "ssim", "label-acc", "epsilon")


@dataclass(frozen=True)
class StrategyEntry:
    """One value of the strategy axis: a strategy and further overrides."""

    label: str = ""
    strategy: str | dict[str, Any] | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DefenceEntry:
    """One value of the defence axis: a defence chain, for some or all strategies."""

    label: str = ""
    chain: tuple[dict[str, Any], ...] = ()
    strategies: tuple[str, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompareSpec:
    """A sweep: the base scenario and its axes (see the module docstring)."""

    base: str | dict[str, Any]
    name: str = "compare"
    description: str = ""
    seeds: tuple[int, ...] = (0,)
    parallel: int = 1
    accuracy: Literal["auto", "test-acc", "client-eval-acc"] = "auto"
    success_psnr: float = DEFAULT_SUCCESS_PSNR
    overrides: dict[str, Any] = field(default_factory=dict)
    strategies: tuple[StrategyEntry, ...] = (StrategyEntry(),)
    defences: tuple[DefenceEntry, ...] = (DefenceEntry(label="none"),)

    def __post_init__(self) -> None:
        require(len(self.seeds) >= 1, "seeds", self.seeds, "list at least one seed")
        require(len(set(self.seeds)) == len(self.seeds), "seeds", self.seeds, "must differ")
        for i, seed in enumerate(self.seeds):
            require_seed(seed, f"seeds[{i}]")
        require_file_name(self.name, "name")  # the sweep folder is named after it
        require(self.parallel >= 1, "parallel", self.parallel, "must be >= 1")
        require(len(self.strategies) >= 1, "strategies", (), "list at least one strategy")
        require(len(self.defences) >= 1, "defences", (), "list at least one defence entry")


@dataclass(frozen=True)
class Configuration:
    """One run of the sweep: a (strategy, defence) pair at one seed."""

    label: str
    strategy: str
    defence: str
    seed: int
    scenario: Scenario

    @property
    def path(self) -> Path:
        """The run directory, relative to the sweep's ``runs/`` folder."""
        return Path(slug(self.label)) / f"seed-{self.seed}"


def slug(label: str) -> str:
    """A folder name for ``label``: lower-case words joined by dashes."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "run"


NAME_OR_TABLE = ("strategy", "partitioner")  # components given by a name or a table


def merge(
    base: Mapping[str, Any], overrides: Mapping[str, Any], prefix: str = ""
) -> dict[str, Any]:
    """``base`` with ``overrides``: tables merge key by key, other values replace.

    A value never replaces a table (or a table a value), except a component
    given by name or table: that mistake would silently drop a whole table.
    """
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        old = out.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            out[key] = merge(old, value, f"{prefix}{key}.")
            continue
        require(
            old is None
            or isinstance(value, Mapping) == isinstance(old, Mapping)
            or key in NAME_OR_TABLE,
            f"{prefix}{key}",
            value,
            "must be a table (it would replace the table of that name)"
            if isinstance(old, Mapping)
            else f"is not a table here (the base has {old!r})",
        )
        out[key] = copy.deepcopy(value)
    return out


def load_spec(path: str | Path) -> tuple[CompareSpec, dict[str, Any]]:
    """The spec in ``path`` and its base scenario's raw tables."""
    path = Path(path)
    raw = read_toml(path, "spec")
    raw.setdefault("name", path.stem)
    spec = parse_table(CompareSpec, raw)
    if isinstance(spec.base, str):
        base = read_toml(path.parent / spec.base, "base")
    else:
        base = dict(spec.base)
    return spec, base


def _strategy_label(entry: StrategyEntry, base: Mapping[str, Any]) -> str:
    chosen = entry.strategy if entry.strategy is not None else base.get("strategy", "fedavg")
    return entry.label or (chosen if isinstance(chosen, str) else str(chosen.get("name", "")))


def _defence_label(entry: DefenceEntry) -> str:
    return entry.label or (" + ".join(str(t.get("name")) for t in entry.chain) or "none")


def configurations(spec: CompareSpec, base: Mapping[str, Any]) -> list[Configuration]:
    """Every configuration of the sweep, each scenario validated (a :class:`ScenarioError`)."""
    strategy_labels = [_strategy_label(s, base) for s in spec.strategies]
    defence_labels = [_defence_label(d) for d in spec.defences]
    for axis, labels in (("strategies", strategy_labels), ("defences", defence_labels)):
        require(len(set(labels)) == len(labels), axis, labels, "labels must differ")
    for i, entry in enumerate(spec.defences):
        unknown = sorted(set(entry.strategies) - set(strategy_labels))
        require(
            not unknown,
            f"defences[{i}].strategies",
            unknown,
            f"not a strategy label; labels: {', '.join(strategy_labels)}",
        )
    out: list[Configuration] = []
    for s_entry, s_label in zip(spec.strategies, strategy_labels, strict=True):
        for d_entry, d_label in zip(spec.defences, defence_labels, strict=True):
            if d_entry.strategies and s_label not in d_entry.strategies:
                continue
            label = s_label if not d_entry.chain and d_label == "none" else f"{s_label} + {d_label}"
            for seed in spec.seeds:
                scenario = _scenario(spec, base, s_entry, d_entry, label, seed)
                out.append(Configuration(label, s_label, d_label, seed, scenario))
    slugs = [str(c.path) for c in out]
    require(len(set(slugs)) == len(slugs), "labels", slugs, "configuration folders must differ")
    return out


def _scenario(
    spec: CompareSpec,
    base: Mapping[str, Any],
    s_entry: StrategyEntry,
    d_entry: DefenceEntry,
    label: str,
    seed: int,
) -> Scenario:
    try:
        raw = merge(base, spec.overrides)
        if s_entry.strategy is not None:
            raw["strategy"] = copy.deepcopy(s_entry.strategy)
        raw = merge(raw, s_entry.overrides)
        raw = merge(raw, {"defences": list(d_entry.chain), **d_entry.overrides})
        raw = merge(raw, {"federation": {"seed": seed}, "audit": {"seed": seed}})
        raw["name"] = f"{spec.name}-{slug(label)}-seed-{seed}"
        scenario = scenario_from_dict(raw)
        check_components(scenario)
        return scenario
    except ScenarioError as err:
        raise ScenarioError(f"[{label}, seed {seed}] {err.key}", err.value, err.allowed) from None


def scenario_hash(scenario: Scenario) -> str:
    """A short hash of the resolved scenario: a finished run is reused only for the same one."""
    return hashlib.sha256(tomli_w.dumps(scenario_to_dict(scenario)).encode()).hexdigest()[:16]


def check_machines(configs: list[Configuration]) -> None:
    """Every configuration can run on this machine (data present, GPUs there), as
    ``fedsim run`` checks it; a dry run and a sweep refuse the same ones."""
    for config in configs:
        try:
            check_machine(config.scenario)
        except ScenarioError as err:
            raise ScenarioError(f"[{config.label}] {err.key}", err.value, err.allowed) from None


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
        if status in (INTERRUPTED_STATUS, -signal.SIGTERM, -signal.SIGINT):
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
    with RaySession(scan=children.processes).watching():
        try:
            list(pool.map(one, todo))
        except KeyboardInterrupt:
            children.interrupt()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _finite_mean(values: pd.Series) -> float:
    finite = values[np.isfinite(values.astype(float))]
    return float(finite.mean()) if len(finite) else math.nan


def run_results(
    config: Configuration,
    run_dir: Path,
    accuracy: str,
    success_psnr: float = DEFAULT_SUCCESS_PSNR,
) -> list[dict[str, Any]]:
    """One row per attack (one row if not audited) of a finished run."""
    metrics = pd.read_csv(run_dir / METRICS_FILE)
    last = metrics.iloc[-1]
    source = accuracy
    if accuracy == "auto":
        source = (
            protocol.TEST_ACC if math.isfinite(float(last.get(protocol.TEST_ACC, math.nan))) else ""
        )
        source = source or protocol.CLIENT_EVAL_ACC
    row: dict[str, Any] = {
        "configuration": config.label,
        "strategy": config.strategy,
        "defence": config.defence,
        "seed": config.seed,
        "accuracy": float(last.get(source, math.nan)),
        "accuracy-from": source,
        "epsilon": float(last.get(protocol.DP_EPSILON, math.nan)),
        "rounds": len(metrics),
        "seconds": read_wall_seconds(run_dir),
        "run": str(run_dir.relative_to(run_dir.parents[2])),  # relative to the sweep
    }
    audit_file = run_dir / AUDIT_FILE
    if not audit_file.is_file():
        unaudited = {"psnr": math.nan, "ssim": math.nan, "label-acc": math.nan}
        return [{**row, "attack": "", **unaudited, **leakage_stats([], success_psnr)}]
    audit = pd.read_csv(audit_file)
    col = AuditRecord.column
    threat = "/".join(sorted(set(audit[col("threat_model")])))
    scored = [
        (attack, group[col("psnr")], group[col("ssim")], group[col("label_acc")])
        for attack, group in audit.groupby(col("attack"), sort=False)
    ]
    verdicts = verdict_rows(audit)
    if verdicts is not None:  # a portfolio ran: its worst case per victim comes first
        scored.insert(0, (VERDICT, verdicts["psnr"], verdicts["ssim"], verdicts["label-acc"]))
    return [
        {
            **row,
            "attack": attack,
            "threat-model": threat,
            "audited": len(psnr),
            "psnr": _finite_mean(psnr),
            "ssim": float(ssim.mean()),
            "label-acc": float(labels.mean()),
            **leakage_stats(psnr, success_psnr),
        }
        for attack, psnr, ssim, labels in scored
    ]


VERDICT = "verdict"
"""The ``attack`` of a run's verdict rows: per victim the best of its attacks."""


def verdict_rows(audit: pd.DataFrame) -> pd.DataFrame | None:
    """A run's verdicts (as in its ``verdict.csv``) when more than one attack ran; else
    ``None``: the verdict is that attack."""
    several = audit[AuditRecord.column("attack")].nunique() > 1
    return victim_verdicts(audit) if several else None


def collect_results(
    configs: list[Configuration],
    runs: Path,
    accuracy: str,
    success_psnr: float = DEFAULT_SUCCESS_PSNR,
) -> pd.DataFrame:
    """Every finished run's rows, in spec order."""
    rows = [r for c in configs for r in run_results(c, runs / c.path, accuracy, success_psnr)]
    return pd.DataFrame(rows)


def collect_attacks(configs: list[Configuration], runs: Path) -> pd.DataFrame:
    """Every audited attack of every finished run: configuration, seed, attack, PSNR."""
    col = AuditRecord.column
    frames = []
    for c in configs:
        if not (runs / c.path / AUDIT_FILE).is_file():
            continue
        audit = pd.read_csv(runs / c.path / AUDIT_FILE)
        verdicts = verdict_rows(audit)
        audit = audit[[col("attack"), col("psnr")]]
        if verdicts is not None:
            audit = pd.concat([verdicts[["psnr"]].assign(attack=VERDICT), audit])
        frames.append(audit.assign(configuration=c.label, seed=c.seed))
    columns = ["attack", "psnr", "configuration", "seed"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def summarise(
    results: pd.DataFrame,
    attacks: pd.DataFrame | None = None,
    success_psnr: float = DEFAULT_SUCCESS_PSNR,
) -> pd.DataFrame:
    """Mean and (sample) std over seeds of each score, per configuration and attack;
    with ``attacks`` (:func:`collect_attacks`) also the median and max PSNR and the
    success share over every attack of every seed."""
    if results.empty:
        return pd.DataFrame()
    rows = []
    for (label, attack), group in results.groupby(["configuration", "attack"], sort=False):
        row: dict[str, Any] = {
            "configuration": label,
            "strategy": group["strategy"].iloc[0],
            "defence": group["defence"].iloc[0],
            "attack": attack,
            "accuracy-from": "/".join(sorted(set(group["accuracy-from"]))),
            "seeds": len(group),
        }
        for score in SCORES:
            values = group[score].astype(float)
            row[f"{score}-mean"] = _finite_mean(values)
            finite = values[np.isfinite(values)]
            row[f"{score}-std"] = float(finite.std(ddof=1)) if len(finite) > 1 else math.nan
        if attacks is not None:
            pooled = attacks[(attacks["configuration"] == label) & (attacks["attack"] == attack)]
            stats = leakage_stats(pooled["psnr"], success_psnr)
            row["attacks"] = len(pooled)
            row.update({k: stats[k] for k in ("psnr-median", "psnr-max", "success-rate")})
        rows.append(row)
    return pd.DataFrame(rows)


def table_markdown(table: pd.DataFrame, success_psnr: float = DEFAULT_SUCCESS_PSNR) -> str:
    """The summary table as markdown (accuracy in %, PSNR in dB)."""
    with_eps = "epsilon-mean" in table and bool(np.isfinite(table["epsilon-mean"]).any())
    with_attack = table["attack"].nunique() > 1
    with_spread = "success-rate" in table
    head = ["configuration", *(["attack"] if with_attack else []), "accuracy (%)", "from"]
    head += ["PSNR (dB)"]
    head += ["PSNR median", "PSNR max", f"success (≥ {success_psnr:g} dB)"] if with_spread else []
    head += ["SSIM", "label acc. (%)", *(["epsilon"] if with_eps else []), "seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in table.iterrows():
        cells = [r["configuration"], *([r["attack"]] if with_attack else [])]
        cells += [
            mean_std_text(r["accuracy-mean"], r["accuracy-std"], 100),
            f"`{r['accuracy-from']}`",
        ]
        cells += [mean_std_text(r["psnr-mean"], r["psnr-std"])]
        if with_spread:
            cells += [
                number_text(r["psnr-median"]),
                number_text(r["psnr-max"]),
                number_text(r["success-rate"], 0, 100, "%"),
            ]
        cells += [
            mean_std_text(r["ssim-mean"], r["ssim-std"], digits=3),
            mean_std_text(r["label-acc-mean"], r["label-acc-std"], 100, digits=0),
        ]
        cells += [mean_std_text(r["epsilon-mean"], r["epsilon-std"])] if with_eps else []
        lines.append("| " + " | ".join(map(str, [*cells, r["seeds"]])) + " |")
    return "\n".join(lines) + "\n"


def plot_privacy_utility(table: pd.DataFrame, title: str, path: Path) -> None:
    """Accuracy against audit PSNR, one point (mean, std bars) per configuration."""
    figure = Figure(figsize=(7, 5))
    ax = figure.subplots()
    points = table[np.isfinite(table["psnr-mean"]) & np.isfinite(table["accuracy-mean"])]
    markers = dict(zip(points["attack"].unique(), "osD^v<>", strict=False))
    for _, r in points.iterrows():
        label = r["configuration"] + (f" ({r['attack']})" if len(markers) > 1 else "")
        ax.errorbar(
            r["psnr-mean"],
            100 * r["accuracy-mean"],
            xerr=np.nan_to_num(r["psnr-std"]),
            yerr=np.nan_to_num(100 * r["accuracy-std"]),
            fmt=markers.get(r["attack"], "o"),
            capsize=3,
            label=label,
        )
        ax.annotate(
            label,
            (r["psnr-mean"], 100 * r["accuracy-mean"]),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    ax.set_xlabel("audit PSNR (dB, peak 1 on [0, 1]); lower = less leakage")
    ax.set_ylabel("final accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(points):
        ax.legend(fontsize=8, loc="best")
    figure.savefig(path, dpi=150, bbox_inches="tight")


def write_outputs(
    spec: CompareSpec,
    results: pd.DataFrame,
    table: pd.DataFrame,
    failed: Mapping[str, str],
    out: Path,
) -> None:
    """``results.csv``, ``table.csv``, ``table.md``, the plot and ``report.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    results.to_csv(out / RESULTS_FILE, index=False)
    table.to_csv(out / TABLE_CSV, index=False)
    markdown = (
        table_markdown(table, spec.success_psnr) if not table.empty else "(no finished runs)\n"
    )
    (out / TABLE_MD).write_text(markdown)
    if not table.empty:
        plot_privacy_utility(table, spec.name, out / PLOT_FILE)
    (out / REPORT_FILE).write_text(report_markdown(spec, results, markdown, failed))
    sweep = {"name": spec.name, "description": spec.description, "success-psnr": spec.success_psnr}
    (out / SWEEP_FILE).write_text(json.dumps({**sweep, "failed": dict(failed)}, indent=2) + "\n")
    write_sweep_report(out)


def _read_frame(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:  # a sweep without finished runs
        return pd.DataFrame()
    if "attack" in frame:  # unaudited runs have an empty attack, which pandas reads as nan
        frame["attack"] = frame["attack"].fillna("")
    return frame


def write_sweep_report(out: Path) -> Path:
    """``report.html`` in a sweep folder, from the files :func:`write_outputs` wrote."""
    from fedsim.outputs.report import write_compare_report

    sweep = json.loads((out / SWEEP_FILE).read_text())
    table = _read_frame(out / TABLE_CSV)
    plot = out / PLOT_FILE
    return write_compare_report(
        out,
        sweep["name"],
        sweep["description"],
        table,
        _read_frame(out / RESULTS_FILE),
        plot.read_bytes() if plot.is_file() and not table.empty else None,
        sweep["failed"],
        sweep["success-psnr"],
        RUN_REPORT_FILE,
    )


def report_markdown(
    spec: CompareSpec, results: pd.DataFrame, table_md: str, failed: Mapping[str, str]
) -> str:
    """The sweep's report: setting, table, plot and the runs behind them."""
    base = spec.base if isinstance(spec.base, str) else "inline [base] table"
    threat = ", ".join(sorted(set(results.get("threat-model", pd.Series()).dropna()))) or "-"
    lines = [
        f"# {spec.name}",
        "",
        *([spec.description, ""] if spec.description else []),
        f"Base scenario: {base}. Seeds: {', '.join(map(str, spec.seeds))}. "
        f"Audit threat model: {threat}.",
        "",
        "## Privacy and utility",
        "",
        table_md,
        "Mean ± sample std over seeds. Accuracy is the final round's; the `from` column says "
        "which: `test-acc` is the global model on the held-out test set, `client-eval-acc` the "
        "personalised evaluation (each client's own model, for FedSplit/FedCG its private "
        "extractor with the shared classifier, on its local test split; mean over clients), "
        "used where a strategy has no global model. PSNR = 10 log10(1 / MSE) on pixels in "
        "[0, 1] (peak 1), SSIM with an 11-pixel Gaussian window, label accuracy the multiset "
        "overlap; each is the mean over every audited (round, victim) of a run. PSNR median, "
        "max and success (the share of attacks reaching the threshold) pool every attack of "
        "every seed. Lower PSNR and SSIM mean less leakage. epsilon (DP-SGD rows) is the "
        "final round's (delta as set).",
        "",
        f"![privacy-utility plot]({PLOT_FILE})",
        "",
        "## Runs",
        "",
        "| configuration | seed | attack | accuracy | PSNR (dB) | seconds | run |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, r in results.iterrows():
        lines.append(
            f"| {r['configuration']} | {r['seed']} | {r['attack'] or '-'} | "
            f"{100 * r['accuracy']:.2f} | {r['psnr']:.2f} | {r['seconds']:.0f} | "
            f"[{r['run']}]({r['run']}/{SUMMARY_FILE}) |"
        )
    if failed:
        lines += ["", "## Failed runs (left out above; rerun to retry)", ""]
        lines += [f"- {path}: {error}" for path, error in failed.items()]
    return "\n".join(lines) + "\n"
