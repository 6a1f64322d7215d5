"""Run folders: a used ``--out`` is refused unless ``--force``; summaries tell the true time."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import tomli_w

from fedsim.cli import main
from fedsim.core.config import OutputConfig, ScenarioError
from fedsim.core.protocol import AuditRecord
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.outputs.leak_report import class_ids
from fedsim.outputs.results import write_summary
from fedsim.outputs.run_folder import (
    AUDIT_FILE,
    AUDIT_IMAGES,
    CHECKPOINT_DIR,
    LOCK_FILE,
    METRICS_FILE,
    SCENARIO_FILE,
    SUMMARY_FILE,
    new_run_dir,
)
from fedsim.outputs.tables import leakage_stats


def _old_audited_run(folder: Path) -> None:
    (folder / AUDIT_IMAGES).mkdir(parents=True)
    (folder / AUDIT_IMAGES / "round-001-client-2-dlg.png").write_bytes(b"png")
    (folder / AUDIT_FILE).write_text("round,psnr\n1,30\n")
    (folder / SCENARIO_FILE).write_text("name = 'old'\n")
    (folder / CHECKPOINT_DIR).mkdir()
    (folder / "notes.txt").write_text("mine")


def test_a_used_out_folder_is_refused(quick_scenario_table: dict[str, Any], tmp_path: Path) -> None:
    _old_audited_run(tmp_path / "run")

    with pytest.raises(ScenarioError, match="--force") as err:
        new_run_dir(OutputConfig(), "quickstart", tmp_path / "run")

    assert err.value.key == "--out"
    assert (tmp_path / "run" / AUDIT_FILE).is_file()  # nothing touched


def test_force_clears_every_run_file_and_keeps_others(
    quick_scenario_table: dict[str, Any], tmp_path: Path
) -> None:
    _old_audited_run(tmp_path / "run")

    run_dir = new_run_dir(OutputConfig(), "quickstart", tmp_path / "run", force=True)

    # The lock file stays: it is this process's hold on the folder.
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE, "notes.txt"]


def test_new_and_empty_folders_are_accepted(
    quick_scenario_table: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "empty").mkdir()
    scenario = scenario_from_dict(quick_scenario_table)

    assert new_run_dir(scenario.output, scenario.name, tmp_path / "empty").is_dir()
    assert new_run_dir(scenario.output, scenario.name, tmp_path / "new" / "run").is_dir()


def test_cli_refuses_a_used_out_before_ray_starts(
    quick_scenario_table: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def no_ray(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the simulation started")

    monkeypatch.setattr("flwr.simulation.run_simulation", no_ray)

    spec = tmp_path / "s.toml"
    spec.write_text(tomli_w.dumps(quick_scenario_table))
    _old_audited_run(tmp_path / "run")

    status = main(["run", str(spec), "--out", str(tmp_path / "run")])

    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and "--force" in err[0]


def test_leakage_stats_show_what_a_mean_hides() -> None:
    # The case: two attacks at 3.3 and 54.7 dB average to 29 dB.
    stats = leakage_stats([3.3, 54.7], threshold=20.0)

    assert stats["psnr-mean"] == pytest.approx(29.0)
    assert stats["psnr-median"] == pytest.approx(29.0)
    assert stats["psnr-max"] == pytest.approx(54.7)
    assert stats["success-rate"] == pytest.approx(0.5)
    # An exact reconstruction (inf) is a success and the max; nan is neither.
    stats = leakage_stats([math.inf, 10.0, math.nan, 12.0], threshold=20.0)
    assert stats["psnr-mean"] == pytest.approx(11.0)
    assert stats["psnr-max"] == math.inf
    assert stats["success-rate"] == pytest.approx(0.25)


def test_summary_has_the_true_wall_time_and_the_audit(
    quick_scenario_table: dict[str, Any], tmp_path: Path
) -> None:
    rows = [{"round": r, "test-acc": 0.5, "seconds": 0.3} for r in (1, 2)]
    pd.DataFrame(rows).to_csv(tmp_path / METRICS_FILE, index=False)
    audit = [
        {
            AuditRecord.column("round"): r,
            AuditRecord.column("client"): 0,
            AuditRecord.column("batch_size"): 1,
            AuditRecord.column("attack"): "dlg",
            AuditRecord.column("psnr"): p,
            AuditRecord.column("ssim"): 0.5,
            AuditRecord.column("label_acc"): 1.0,
            AuditRecord.column("converged"): r == 1,
            AuditRecord.column("attacker_residual"): 0.1,
            AuditRecord.column("seconds"): 2.0,
        }
        for r, p in ((1, 3.3), (2, 54.7))
    ]
    pd.DataFrame(audit).to_csv(tmp_path / AUDIT_FILE, index=False)

    text = write_summary(scenario_from_dict(quick_scenario_table), rows, tmp_path, 105.0)

    assert "wall time: 1m45s (105.0s" in text
    assert "in rounds 0.6s" in text
    (dlg,) = [line for line in text.splitlines() if line.startswith("| dlg ")]
    cells = [cell.strip() for cell in dlg.strip("|").split("|")]
    assert cells == ["dlg", "2", "29.00", "29.00", "54.70", "50%", "0.500", "100%", "50%", "2.0"]
    # The verdict per round comes first: one victim a round, so no interval.
    verdict = text.index("verdict PSNR")
    assert verdict < text.index("| attack ")
    assert "54.70" in text[verdict:] and "lower bound" in text[verdict:]
    assert (tmp_path / SUMMARY_FILE).read_text() == text


def test_the_classes_a_representatives_row_read_come_back_from_the_csv() -> None:
    """pandas reads one class back as a number, and a column with empty cells as floats."""
    mixed = pd.read_csv(io.StringIO('round,representatives-classes\n1,"1;3;5"\n1,6\n1,\n'))
    single = pd.read_csv(io.StringIO("round,representatives-classes\n1,6\n1,\n"))

    assert [class_ids(v) for v in mixed["representatives-classes"]] == [[1, 3, 5], [6], []]
    assert [class_ids(v) for v in single["representatives-classes"]] == [[6], []]
