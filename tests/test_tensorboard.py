"""``[log] tensorboard = true``: per-round scalars and audit grids as TensorBoard events."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from inprocess import InProcessGrid, tiny_table
from rich.console import Console
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedsim.clients.app import build_client_app
from fedsim.core.metrics import score_reconstruction
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.outputs.figures import draw_pairs, scored_pairs
from fedsim.outputs.results import RunRecorder
from fedsim.outputs.run_folder import (
    AUDIT_IMAGES,
    CLIENT_STATE_DIR,
    METRICS_FILE,
    TENSORBOARD_DIR,
    audit_image_name,
    new_run_dir,
)
from fedsim.scenario.components import client_spec
from fedsim.scenario.validate import check_components
from fedsim.simulation.flower import message_context
from fedsim.simulation.runner import serve
from fedsim.strategies import STRATEGIES


def test_scalars_per_round_and_audit_grids_reach_tensorboard(tmp_path: Path) -> None:
    table = tiny_table({"name": "fedavg"}, log={"tensorboard": True})
    table["data"]["samples-per-client"] = 40
    scenario = scenario_from_dict(table)
    run_dir = new_run_dir(scenario.output, scenario.name, tmp_path / "run")
    # An audit grid as the auditor writes it (the audit itself needs Ray).
    truth = torch.rand(2, 1, 16, 16)
    score = score_reconstruction(truth.flip(0), truth, torch.tensor([3, 1]), torch.tensor([1, 3]))
    (run_dir / AUDIT_IMAGES).mkdir()
    grid_png = run_dir / AUDIT_IMAGES / audit_image_name(1, 2, "dlg")
    pairs = scored_pairs(truth, torch.tensor([1, 3]), truth.flip(0), torch.tensor([3, 1]), score)
    draw_pairs(grid_png, pairs)
    routine = STRATEGIES.get("fedavg").client_routine
    grid = InProcessGrid(
        build_client_app(client_spec(scenario), routine, run_dir / CLIENT_STATE_DIR), 3
    )
    recorder = RunRecorder(run_dir, scenario.federation.rounds, Console(quiet=True))

    with message_context():
        serve(grid, check_components(scenario), recorder, Console(quiet=True))  # type: ignore[arg-type]

    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR), size_guidance={"images": 0})
    events.Reload()
    metrics = pd.read_csv(run_dir / METRICS_FILE)
    logged = [(e.step, e.value) for e in events.Scalars("test-acc")]
    expected = zip(metrics["round"], metrics["test-acc"], strict=True)
    assert logged == [(r, pytest.approx(v, rel=1e-6)) for r, v in expected]  # float32 events
    assert {"train-loss", "client-eval-acc", "seconds"} <= set(events.Tags()["scalars"])
    (image,) = events.Images("audit/client-2-dlg")
    assert image.step == 1 and image.width > 0 and image.height > 0
