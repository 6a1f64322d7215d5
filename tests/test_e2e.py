"""End to end: a real Flower simulation on Ray leaves a complete run directory."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from fedsim.core.scenario_file import load_scenario, scenario_from_dict
from fedsim.outputs.run_folder import (
    AUDIT_FILE,
    CLIENTS_FILE,
    LEAKS_FILE,
    METRICS_FILE,
    MODEL_FILE,
    REPORT_FILE,
    SCENARIO_FILE,
    SUMMARY_FILE,
    VERDICT_FILE,
)
from fedsim.simulation.runner import run_scenario


@pytest.mark.slow
def test_fedavg_simulation_writes_run_directory(
    quick_scenario_table: dict[str, Any], tmp_path: Path
) -> None:
    scenario = scenario_from_dict(copy.deepcopy(quick_scenario_table))

    result = run_scenario(scenario, tmp_path / "run")

    run = tmp_path / "run"
    for name in (SCENARIO_FILE, METRICS_FILE, CLIENTS_FILE, MODEL_FILE, SUMMARY_FILE):
        assert (run / name).is_file(), name
    metrics = pd.read_csv(run / METRICS_FILE)
    assert list(metrics["round"]) == [1, 2]
    assert {
        "train-loss",
        "test-acc",
        "test-loss",
        "client-eval-acc",
        "clients-trained",
        "seconds",
    } <= set(metrics)
    assert list(metrics["clients-trained"]) == [3, 3]
    # Two short rounds of a Sigmoid LeNet leave the plateau: above chance (0.1,
    # cross-entropy ln 10 = 2.303) and still improving.
    assert metrics["test-acc"].iloc[-1] > 0.15
    assert metrics["test-loss"].iloc[-1] < 2.25
    assert metrics["train-loss"].iloc[-1] < metrics["train-loss"].iloc[0]
    clients = pd.read_csv(run / CLIENTS_FILE)
    assert sorted(clients.query("phase == 'train' and round == 1")["partition-id"]) == [
        0,
        1,
        2,
    ]
    resolved = tomllib.loads((run / SCENARIO_FILE).read_text())
    assert scenario_from_dict(resolved) == scenario
    state = torch.load(run / MODEL_FILE, weights_only=True)
    assert set(state) == set(result.final_arrays.keys())


@pytest.mark.slow
def test_the_readme_main_job_audits_every_clients_real_update(tmp_path: Path) -> None:
    """``make demo``'s scenario as shipped, its first 2 of 5 rounds: FedAvg learns; every
    client's real update (800 images, 2 epochs of Adam) is analysed every round, none is
    skipped; round 1's probe is reconstructed as a counterfactual and kept apart."""
    run = tmp_path / "demo"
    quickstart = Path(__file__).parents[1] / "scenarios" / "quickstart.toml"
    run_scenario(load_scenario(quickstart, ["federation.rounds=2"]), run)

    metrics = pd.read_csv(run / METRICS_FILE)
    assert list(metrics["round"]) == [1, 2]
    assert metrics["test-acc"].iloc[-1] > 0.6  # measured 0.730 after round 2
    leaks = pd.read_csv(run / LEAKS_FILE)
    for kind in ("labels", "membership"):  # every client, every round
        rows = leaks[leaks["kind"] == kind]
        assert set(zip(rows["round"], rows["client"], strict=True)) == {
            (r, c) for r in (1, 2) for c in range(4)
        }
    assert (leaks["threat-model"] == "update").all() and (leaks["examples"] == 800).all()
    membership = leaks[leaks["kind"] == "membership"]
    assert (membership["candidates"] >= 100).all()
    assert (membership["membership-auc-low"] <= membership["membership-auc"]).all()
    assert metrics[["audit-label-tv", "audit-membership-auc"]].notna().all().all()
    # No attack reconstructs an 800-image Adam update: what was reconstructed is round 1's
    # probe, a counterfactual, and it stays out of the verdict on what was received.
    audit = pd.read_csv(run / AUDIT_FILE)
    assert set(audit["round"]) == {1} and audit["counterfactual"].all()
    assert set(audit["threat-model"]) == {"probe"}
    assert {"analytic-fc-probe", "inverting-gradients-probe", "grnn-probe"} <= set(audit["attack"])
    assert metrics["audit-psnr"].isna().all()
    assert metrics["audit-counterfactual-psnr"].iloc[0] >= 20.0  # measured 38.2 dB
    verdict = pd.read_csv(run / VERDICT_FILE)
    assert len(verdict) == 2 * 4 and (verdict["attacks"] == 0).all()
    report = (run / REPORT_FILE).read_text()
    assert "membership ROC curves" in report and "estimated against true label" in report
    summary = (run / SUMMARY_FILE).read_text()
    assert "## Privacy audit" in summary and "as a counterfactual" in summary
