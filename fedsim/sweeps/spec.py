"""A sweep's spec and its grid: the configurations ``fedsim compare`` runs.

A spec names a base scenario and the axes of a sweep, strategies x defences x
seeds. Each configuration is the base with overrides: the spec's, the strategy
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
    accuracy = "auto"            # or "test-acc" / "client-eval-acc" / "best-val" for every row
    success-psnr = 20.0          # an attack succeeds at this PSNR (dB, peak 1) or above

    [[strategies]]               # default: the base's strategy
    label = "FedAvg"
    strategy = "fedavg"          # or {name = "fedprox", mu = 0.01}
    overrides = { client.lr = 0.01 }   # any scenario keys; tables merge key by key

    [[defences]]                 # default: none
    label = "DP sigma=0.1"
    chain = [{name = "gaussian", sigma = 0.1}]   # the scenario's [[defences]]
    strategies = ["FedAvg"]      # only with these strategy labels (default: all)
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fedsim.core.config import Scenario, ScenarioError, require, require_file_name, require_seed
from fedsim.core.scenario_file import read_toml, scenario_from_dict
from fedsim.core.toml_tables import parse_table
from fedsim.outputs.tables import DEFAULT_SUCCESS_PSNR
from fedsim.scenario.validate import check_components, check_machine


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
    accuracy: Literal["auto", "test-acc", "client-eval-acc", "best-val"] = "auto"
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


def check_machines(configs: list[Configuration]) -> None:
    """Every configuration can run on this machine (data present, GPUs there), as
    ``fedsim run`` checks it; a dry run and a sweep refuse the same ones."""
    for config in configs:
        try:
            check_machine(config.scenario)
        except ScenarioError as err:
            raise ScenarioError(f"[{config.label}] {err.key}", err.value, err.allowed) from None
