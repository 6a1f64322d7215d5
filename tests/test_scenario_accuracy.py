"""The shipped training scenarios learn: each ends above a stated test accuracy.

``quickstart`` (``make demo``) is held by tests/test_e2e.py (above 0.6 after round 2 of
its audited run, measured 0.730); this file holds the federation that README offers for
a realistic audit, which once sat at 0.1000 for all its rounds on the Sigmoid LeNet-5.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fedsim.core.scenario_file import load_scenario
from fedsim.outputs.run_folder import METRICS_FILE
from fedsim.simulation.runner import run_scenario

SCENARIOS = Path(__file__).parents[1] / "scenarios"


@pytest.mark.slow(reason="a 20-client simulation on Ray, 3 rounds unaudited (83 s at load 7)")
def test_audit_realistic_learns(tmp_path: Path) -> None:
    """``audit-realistic`` trained without its audit for 3 of its 5 rounds: measured test
    accuracy 0.525 / 0.811 / 0.884 over rounds 1-3 (0.895 after round 5), seed 0."""
    scenario = load_scenario(
        SCENARIOS / "audit-realistic.toml", ["federation.rounds=3", "audit.enabled=false"]
    )

    run_scenario(scenario, tmp_path / "run")

    metrics = pd.read_csv(tmp_path / "run" / METRICS_FILE)
    assert list(metrics["round"]) == [1, 2, 3]
    assert metrics["test-acc"].iloc[-1] > 0.80
