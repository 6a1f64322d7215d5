"""``fedsim attack``: a table, a CSV, a grid and the settings, from one command."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pandas as pd
import pytest
import torch

from fedsim.audit.experiment import GRID_FILE, RESULTS_FILE, SETTINGS_FILE
from fedsim.cli import main
from fedsim.commands.attack import check_flags


def test_attack_command_writes_its_table_grid_and_settings(tmp_path: Path) -> None:
    out = tmp_path / "attack"

    status = main(
        [
            "attack",
            "--attack", "sapag",
            "--dataset", "mnist-samples",
            "--batch-size", "2",
            "--num-images", "4",
            "--steps", "2",
            "--restarts", "1",
            "--set", "labels=infer",
            "--out", str(out),
        ]
    )  # fmt: skip

    assert status == 0
    table = pd.read_csv(out / RESULTS_FILE)
    assert list(table["batch"]) == [0, 1]
    assert {"psnr", "ssim", "mse", "label-acc", "final-objective", "seconds"} <= set(table.columns)
    assert (table["label-acc"] == 1.0).all()  # counting, at batch 2
    assert (out / GRID_FILE).stat().st_size > 0
    settings = tomllib.loads((out / SETTINGS_FILE).read_text())
    assert settings["params"]["labels"] == "infer"
    assert settings["params"]["steps"] == 2
    assert settings["run"]["attack"] == "sapag"


def test_lfw_faces_get_a_classifier_of_ten(tmp_path: Path) -> None:
    status = main(
        ["attack", "--dataset", "lfw-faces", "--num-images", "1", "--steps", "1",
         "--restarts", "1", "--out", str(tmp_path)]
    )  # fmt: skip

    assert status == 0
    assert pd.read_csv(tmp_path / RESULTS_FILE)["labels"].tolist() == [0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--attack", "nope"], "--attack = 'nope'"),
        (["--set", "labels=maybe"], "attack.labels = 'maybe'"),
        (["--set", "restart=2"], "attack.restart"),
        (["--batch-size", "3", "--num-images", "4"], "--num-images = 4"),
        # Closed-form attacks read one image: refused before any image is loaded.
        (["--attack", "analytic-fc", "--batch-size", "2", "--num-images", "2"], "at most 1"),
        (["--attack", "unrolled-dlg"], "gives one batch's gradient"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["attack", *args, "--out", str(tmp_path)])

    assert status == 2
    assert message in capsys.readouterr().err


def test_weights_put_every_victim_at_a_runs_trained_model(tmp_path: Path) -> None:
    from fedsim.audit.experiment import AttackExperiment, experiment_probes
    from fedsim.core.config import ModelConfig, ScenarioError
    from fedsim.core.models import InputSpec, build_model

    trained = build_model(ModelConfig("lenet5-split"), InputSpec(1, 32, 10), seed=7).state_dict()
    weights = tmp_path / "model.pt"
    torch.save(trained, weights)
    experiment = AttackExperiment(
        dataset="mnist-embedded", model="lenet5-split", init="default", num_images=2,
        weights=str(weights), params={"steps": 1, "restarts": 1},
    )  # fmt: skip

    probes, _ = experiment_probes(experiment)

    for probe in probes:
        sent = probe.observation.global_params
        assert all(torch.equal(sent[k], trained[k]) for k in sent)
    with pytest.raises(ScenarioError, match="--weights"):
        check_flags(AttackExperiment(weights=str(tmp_path / "missing.pt")))
    torch.save({"not": torch.zeros(1)}, tmp_path / "other.pt")
    other = AttackExperiment(
        dataset="mnist-embedded", model="lenet5-split", weights=str(tmp_path / "other.pt")
    )
    with pytest.raises(ScenarioError, match="does not fit the model"):
        experiment_probes(other)


def test_a_closed_form_attack_runs_through_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedsim.core.config import ModelConfig
    from fedsim.core.models import InputSpec, build_model

    out = tmp_path / "analytic"
    weights = tmp_path / "model.pt"
    trained = build_model(ModelConfig("lenet5-split"), InputSpec(1, 32, 10), seed=3)
    torch.save(trained.state_dict(), weights)

    status = main(
        [
            "attack",
            "--attack", "analytic-fc",
            "--dataset", "mnist-embedded",
            "--model", "lenet5-split",
            "--weights", str(weights),
            "--num-images", "1",
            "--out", str(out),
        ]
    )  # fmt: skip

    assert status == 0
    said = "".join(capsys.readouterr().out.split())  # rich wraps the title to the terminal
    assert f"lenet5-split(weights{weights})" in said  # not the --init it did not use
    assert "uniform" not in said
    table = pd.read_csv(out / RESULTS_FILE)
    # Features read exactly off the classifier's first layer, inverted through the
    # extractor: measured 35-43 dB on these digits.
    assert table["psnr"].min() > 25.0 and table["converged"].all()
