"""examples/fedcg_audited.py: a user's own Flower app with FedCG and the audit, run as shipped."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fedcg_audited.py"


@pytest.mark.slow
def test_example_app_runs_fedcg_under_flowers_start_with_an_unscored_audit(
    tmp_path: Path,
) -> None:
    spec = importlib.util.spec_from_file_location("fedcg_audited", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    example.run(tmp_path, rounds=2, distill_iterations=5)

    audit = pd.read_csv(tmp_path / "audit.csv")
    assert list(audit["round"]) == [1, 2]  # one victim a round, both rounds attacked
    assert (audit["strategy"] == "fedcg").all()
    # No truth source: recorded, not scored; the attacker's own objective is there.
    assert audit["psnr"].isna().all()
    assert np.isfinite(audit["final-objective"]).all()
    assert (audit["parameters-observed"] > 0).all()
    assert sorted(p.name for p in (tmp_path / "audit").iterdir())[0].startswith("round-001")
