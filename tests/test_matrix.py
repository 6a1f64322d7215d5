"""Every combination runs or is refused in one line: strategies x threat models x the audit.

Each registered strategy (fedsim's and any installed plugin's) under each threat model
with the default audit (``attacks`` and ``leaks`` ``"auto"``, the quickstart's
counterfactual probe in round 1 under ``update``), and each registered leak analysis
named alone under each, is first planned (validation: a run's plan or a one-line
refusal naming both choices), then run for one round on tiny data through the real
strategy, ClientApp, audit, scorer and recorder, in this process
(:func:`inprocess.serve_inprocess`). Two things are shortened, neither of which decides
applicability: reconstruction attacks run inline instead of as Ray tasks
(:class:`InlineAttacks`), and at :data:`STEPS` steps instead of their budgets.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from inprocess import serve_inprocess

from fedsim.attacks.leakage import LEAKS
from fedsim.attacks.leaks.representatives import RepresentativesParams
from fedsim.audit import auditor
from fedsim.audit.tasks import run_attack
from fedsim.core.config import AuditConfig, ScenarioError
from fedsim.core.modality import ANY, IMAGE, TEXT, modality_of
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.threat import ThreatModel
from fedsim.outputs.results import write_summary
from fedsim.outputs.run_folder import LEAKS_FILE, METRICS_FILE, SUMMARY_FILE
from fedsim.scenario import portfolio
from fedsim.scenario.components import Components
from fedsim.scenario.validate import check_components
from fedsim.strategies import STRATEGIES

STEPS = 2  # an optimisation attack's steps here: it runs, it is not measured
# Cells of these run in the fast lane (2-13 s each on a shared 2-core box): fedsim's own
# strategies and one of Flower's built-ins through the adapter. The others' (the other
# built-ins, FedCG's GAN and distillation, plugins) are slow, except under a threat model
# hiding replies, whose one observation a round takes under a second.
FAST = {"fedavg", "fedprox", "fedsplit", "local", "krum"}
STRATEGY_PARAMS = {"fedcg": {"distill-iterations": 20, "gan-steps": 4}}


# The tiny data and model of each modality: a leak analysis is planned and run on its own.
DATA = {
    IMAGE: (
        {"dataset": "mnist-embedded", "samples-per-client": 20, "normalize": True},
        {"name": "lenet5-split"},
    ),
    TEXT: (
        {
            "dataset": "shakespeare-words",
            "partitioner": {"name": "groups"},
            "samples-per-client": 8,
        },
        {"name": "word-transformer"},
    ),
}


def _table(
    strategy: str, threat: ThreatModel, modality: str = IMAGE, **audit: Any
) -> dict[str, Any]:
    """One round of 2 clients of 20 embedded digits (or 8 Shakespeare windows), the default
    audit under ``threat``."""
    data, model = DATA[IMAGE if modality == ANY else modality]  # any: images stand for it
    return {
        "name": "matrix",
        "federation": {"num-clients": 2, "rounds": 1, "seed": 0},
        "data": data,
        "model": model,
        "client": {"local-epochs": 1, "batch-size": 8, "optimizer": "adam", "lr": 0.003},
        "strategy": {"name": strategy, **STRATEGY_PARAMS.get(strategy, {})},
        "audit": {
            "enabled": True,
            "threat-model": str(threat),
            "victims": 1,
            "probe-rounds": [1] if threat == ThreatModel.UPDATE else [],
            **audit,
        },
    }


def _plan(table: dict[str, Any]) -> Components | ScenarioError:
    try:
        return check_components(scenario_from_dict(table))
    except ScenarioError as err:
        return err


class InlineAttacks:
    """:class:`~fedsim.audit.tasks.RemoteAttacks` run in this thread: a finished future."""

    def __init__(self, cfg: AuditConfig, console: Any) -> None:
        self.cfg = cfg

    def submit(self, attack: Any, observations: Any, seed: int, key: str) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(run_attack(attack, observations, seed, False, None, self.cfg.precision))
        return done

    def warm(self, workers: int) -> None:
        return None  # no processes to start

    def show_progress(self) -> None:
        return None


@pytest.fixture
def short_attacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attacks inline, and attacks and inversions at :data:`STEPS` steps (applicability is
    not their budget's)."""
    budget = portfolio.budget

    def short(name: str, setting: Any) -> dict[str, Any]:
        params = budget(name, setting)
        return {**params, "steps": STEPS, "restarts": 1} if "steps" in params else params

    monkeypatch.setattr(portfolio, "budget", short)
    monkeypatch.setattr(auditor, "RemoteAttacks", InlineAttacks)
    # Class representatives invert their features to images in as few steps.
    (first, *_) = dataclasses.fields(RepresentativesParams)
    assert first.name == "inversion_steps"
    _, *rest = RepresentativesParams.__init__.__defaults__ or ()
    monkeypatch.setattr(RepresentativesParams.__init__, "__defaults__", (STEPS, *rest))


def _cells(names: list[str]) -> list[Any]:
    return [
        pytest.param(name, threat, marks=[] if fast else [pytest.mark.slow])
        for name in names
        for threat in ThreatModel
        for fast in [name in FAST or threat.hides_replies]
    ]


def _assert_one_line_naming(refusal: ScenarioError, *choices: str) -> None:
    text = str(refusal)
    assert "\n" not in text, text
    for choice in choices:
        assert choice in text, (choice, text)


def _run(components: Components, tmp_path: Path) -> Path:
    scenario = components.scenario
    _, recorder = serve_inprocess(scenario, tmp_path / "run", components)
    assert len(recorder.rows) == scenario.federation.rounds
    return recorder.run_dir


@pytest.mark.parametrize(("strategy", "threat"), _cells(STRATEGIES.names()))
def test_every_strategy_and_threat_model_runs_the_default_audit_or_is_refused_in_one_line(
    strategy: str, threat: ThreatModel, tmp_path: Path, short_attacks: None
) -> None:
    plan = _plan(_table(strategy, threat))

    if isinstance(plan, ScenarioError):
        _assert_one_line_naming(plan, repr(strategy), repr(str(threat)))
        return
    run_dir = _run(plan, tmp_path)
    assert (run_dir / METRICS_FILE).exists()
    if plan.audit.empty:  # a strategy sharing nothing: nothing to audit, and it says so
        said = f"strategy {strategy!r} shares nothing with the server: nothing to audit"
        assert plan.audit.notes == (said,)


@pytest.mark.parametrize("leak", LEAKS.names())
@pytest.mark.parametrize("threat", list(ThreatModel))
def test_each_leak_analysis_alone_is_planned_or_refused_in_one_line_for_every_strategy(
    leak: str, threat: ThreatModel
) -> None:
    modality = modality_of(LEAKS.get(leak), IMAGE)
    for strategy in STRATEGIES.names():
        plan = _plan(_table(strategy, threat, modality, attacks=[], leaks=[{"name": leak}]))

        if isinstance(plan, ScenarioError):
            _assert_one_line_naming(plan, repr(leak) if plan.key.startswith("audit.leaks") else "")
        else:
            assert [a.name for a in plan.audit.leaks] == [leak]


def _first_cell(leak: str) -> tuple[str, ThreatModel]:
    """The first strategy and threat model (registry order) where ``leak`` applies."""
    modality = modality_of(LEAKS.get(leak), IMAGE)
    for strategy in STRATEGIES.names():
        for threat in ThreatModel:
            plan = _plan(_table(strategy, threat, modality, attacks=[], leaks=[{"name": leak}]))
            if not isinstance(plan, ScenarioError) and plan.audit.leaks:
                return strategy, threat
    raise AssertionError(f"{leak} applies nowhere")


@pytest.mark.parametrize(
    "leak",
    [
        pytest.param(n, marks=[pytest.mark.slow] if n == "generator-representatives" else [])
        for n in LEAKS.names()
    ],
)
def test_each_leak_analysis_named_alone_runs_one_round_where_it_applies(
    leak: str, tmp_path: Path, short_attacks: None
) -> None:
    strategy, threat = _first_cell(leak)
    modality = modality_of(LEAKS.get(leak), IMAGE)
    table = _table(strategy, threat, modality, attacks=[], leaks=[{"name": leak}])
    components = check_components(scenario_from_dict(table))

    run_dir = _run(components, tmp_path)

    leaks = pd.read_csv(run_dir / LEAKS_FILE)
    assert set(leaks["analysis"]) == {leak}, set(leaks["analysis"])


def test_an_aggregate_of_one_client_says_it_adds_nothing_to_the_update() -> None:
    table = _table("fedavg", ThreatModel.AGGREGATE)
    table["federation"]["clients-per-round"] = 1

    plan = check_components(scenario_from_dict(table))

    assert plan.audit.notes[0] == (
        "threat model 'aggregate' over one client a round is that client's update: it adds "
        "nothing to 'update' here"
    )


def test_auto_says_in_the_summary_what_it_left_out_and_why(
    tmp_path: Path, short_attacks: None
) -> None:
    components = check_components(scenario_from_dict(_table("fedsplit", ThreatModel.UPDATE)))
    run_dir = _run(components, tmp_path)

    write_summary(components.scenario, [], run_dir, 1.0, (), components.audit.notes)

    text = (run_dir / SUMMARY_FILE).read_text()
    # fedsplit shares the classifier only: membership needs the whole model's update.
    assert (
        '- audit: audit.leaks = "auto" left out loss-drop: scores candidates against the '
        "whole model's update; strategy 'fedsplit' does not upload it\n"
    ) in text
