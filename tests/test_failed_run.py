"""A run that fails late keeps what it computed: the rounds before the failure are written
(metrics, audit records, summary, report), the full traceback lies in the run folder and
the terminal gets one line. The failure: a plugin leak analysis whose round-2 result its
scorer cannot read (three class counts for ten classes)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import tomli_w
from flwr.app import Context, RecordDict
from inprocess import InProcessGrid, inprocess_recorder, serve_inprocess
from processes import fedsim

from fedsim import app
from fedsim.clients.app import build_client_app
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.outputs.run_folder import (
    LEAKS_FILE,
    METRICS_FILE,
    REPORT_FILE,
    SUMMARY_FILE,
    TRACEBACK_FILE,
)
from fedsim.scenario.components import client_spec
from fedsim.scenario.validate import check_components
from fedsim.simulation.flower import message_context
from fedsim.simulation.runner import RunFailed, keep_failed_run

pytestmark = pytest.mark.usefixtures("plugin_env")  # the plugin's registration undone after

FAILING = """
import torch

from fedsim.attacks.leaks.label_leaks import LLG
from fedsim.attacks.leakage import LEAKS, LabelLeak


@LEAKS.register({name!r})
class FailsInRound2(LLG):
    def analyse(self, inputs, seed=0):
        if inputs.observation.round < 2:
            return super().analyse(inputs, seed)
        return LabelLeak(torch.ones(3))
"""


def _failing_scenario(tmp_path: Path) -> tuple[dict[str, Any], str, Path]:
    """Two rounds audited by the failing analysis alone; the table, its name, its file."""
    name = f"fails-{uuid.uuid4().hex[:6]}"
    plugin = tmp_path / f"failing_{name.replace('-', '_')}.py"
    plugin.write_text(FAILING.format(name=name))
    table = {
        "name": "late-failure",
        "plugins": [str(plugin)],
        "federation": {"num-clients": 2, "rounds": 2, "seed": 0},
        "data": {"dataset": "mnist-embedded", "samples-per-client": 20, "normalize": True},
        "model": {"name": "lenet5-split"},
        "client": {"local-epochs": 1, "batch-size": 8, "optimizer": "adam", "lr": 0.003},
        "strategy": {"name": "fedavg"},
        "backend": {"num-cpus": 1},
        "audit": {"enabled": True, "attacks": [], "leaks": [{"name": name}]},
    }
    return table, name, plugin


def _kept_round_one(run_dir: Path, name: str) -> None:
    assert list(pd.read_csv(run_dir / METRICS_FILE)["round"]) == [1]
    leaks = pd.read_csv(run_dir / LEAKS_FILE)
    assert set(leaks["round"]) == {1} and set(leaks["analysis"]) == {name}
    assert "rounds: 1" in (run_dir / SUMMARY_FILE).read_text()
    assert (run_dir / REPORT_FILE).stat().st_size > 0
    trace = (run_dir / TRACEBACK_FILE).read_text()
    assert trace.startswith("Traceback") and "score_labels" in trace


def test_a_scoring_failure_in_round_two_keeps_round_one_and_says_so_in_one_line(
    tmp_path: Path,
) -> None:
    table, name, _ = _failing_scenario(tmp_path)
    scenario = scenario_from_dict(table)
    components = check_components(scenario)
    recorder = inprocess_recorder(scenario, tmp_path / "run")
    with pytest.raises(RuntimeError, match="must match the size") as failure:
        serve_inprocess(scenario, tmp_path / "run", components, recorder)

    said = keep_failed_run(failure.value, components, recorder)

    run_dir = recorder.run_dir
    _kept_round_one(run_dir, name)
    assert "\n" not in str(said)
    assert str(said).startswith("the run failed after 1 complete round (RuntimeError: ")
    assert str(said).endswith(f"the full traceback is in {run_dir / TRACEBACK_FILE}")


def test_the_flower_apps_server_keeps_round_one_as_fedsim_run_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, name, _ = _failing_scenario(tmp_path)
    scenario_file = tmp_path / "late-failure.toml"
    scenario_file.write_text(tomli_w.dumps(table))
    out = tmp_path / "run"
    client = build_client_app(client_spec(scenario_from_dict(table)), "fedavg", None)
    grid = InProcessGrid(client, 2)
    monkeypatch.setattr(app, "_start_audit_ray", lambda *_: None)  # the audit runs in process
    config = {"scenario": str(scenario_file), "out": str(out)}
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)

    with message_context(), pytest.raises(RunFailed, match="failed after 1 complete round"):
        app.main(grid, context)

    _kept_round_one(out, name)


@pytest.mark.slow
def test_fedsim_run_failing_late_prints_one_line_and_keeps_the_report(tmp_path: Path) -> None:
    _, name, plugin = _failing_scenario(tmp_path)
    out = tmp_path / "run"
    sets = [
        f'plugins=["{plugin}"]',
        f'audit.leaks=[{{name="{name}"}}]',
        "audit.attacks=[]",
        "audit.probe-rounds=[]",
        "federation.rounds=2",
        "federation.num-clients=2",
        "federation.clients-per-round=2",
        "data.samples-per-client=20",
    ]
    args = ["run", "quickstart", "--out", str(out)]
    for value in sets:
        args += ["--set", value]

    process = fedsim(*args)
    _, stderr = process.communicate(timeout=600)

    assert process.returncode == 1, stderr
    assert stderr.strip().count("\n") == 0, stderr
    assert stderr.startswith("fedsim: error: the run failed after 1 complete round"), stderr
    _kept_round_one(out, name)
