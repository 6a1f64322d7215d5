"""Inverting Gradients: its registry names, objective, optimiser and a measured win over DLG."""

from __future__ import annotations

import pytest
import torch
from test_audit_attacks import _two_step_update

from fedsim.attacks import ATTACKS
from fedsim.attacks.reconstruction.ig import InvertingGradients, total_variation
from fedsim.attacks.toolkits.optim import BatchedAdamW
from fedsim.audit.experiment import AttackExperiment, run_attack_experiment
from fedsim.core.metrics import score_reconstruction
from fedsim.core.params.matching import InvertingGradientsParams
from fedsim.core.registry import UnknownNameError
from fedsim.core.toml_tables import parse_table


def test_ig_is_an_alias_of_inverting_gradients() -> None:
    assert ATTACKS.get("ig") is ATTACKS.get("inverting-gradients") is InvertingGradients
    assert ATTACKS.canonical("ig") == "inverting-gradients"
    assert "ig" in ATTACKS
    assert "ig" not in ATTACKS.names()  # listed once, under its full name
    with pytest.raises(UnknownNameError, match=r"aliases: .*\big\b"):
        ATTACKS.get("inverting")


def test_defaults_are_the_papers() -> None:
    p = InvertingGradientsParams()

    assert (p.optimizer, p.learning_rate, p.weight_decay) == ("adamw", 0.1, 0.0)
    assert p.signed_gradient and p.step_decay and p.unroll
    assert (p.clamp, p.labels, p.cosine, p.step_count) == ("iteration", "infer", "joint", 4800)


def test_cosine_distance_ignores_scale_and_weights_layers() -> None:
    g = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    attack = InvertingGradients(InvertingGradientsParams())
    joint = attack.distance_constants(g, [1, 2])
    per_layer = InvertingGradients(InvertingGradientsParams(cosine="per-layer"))
    constants = per_layer.distance_constants(g, [1, 2])

    assert float(attack.distance([5 * t for t in g], g, joint)) == pytest.approx(0, abs=1e-6)
    # Opposite gradients: cosine -1, distance 2 (joint) and 2 per layer (two layers: 4).
    assert float(attack.distance([-t for t in g], g, joint)) == pytest.approx(2.0)
    assert float(per_layer.distance([-t for t in g], g, constants)) == pytest.approx(4.0)
    linear = InvertingGradients(InvertingGradientsParams(layer_weights="linear"))
    assert linear.distance_constants(g, [1, 2])[0].tolist() == [1.0, 0.5]


def test_total_variation_of_a_constant_image_is_zero() -> None:
    flat = torch.full((1, 3, 8, 8), 0.3)
    stripes = torch.zeros(1, 1, 4, 4)
    stripes[..., ::2] = 1.0

    assert float(total_variation(flat)) == 0.0
    assert float(total_variation(stripes)) == pytest.approx(1.0)  # |dx| all 1, |dy| all 0


def test_signed_adam_takes_lr_steps_decays_at_three_five_seven_eighths_and_stays_boxed() -> None:
    z = torch.zeros(2, 3)
    lower, upper = torch.full((3,), -0.25), torch.full((3,), 10.0)
    optimizer = BatchedAdamW(
        z, (lower, upper), lr=0.1, weight_decay=0.0, signed=True, milestones=[3, 5, 7]
    )

    def objective(rows: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Badly scaled gradients: the sign makes every coordinate step alike.
        scale = torch.tensor([1e-6, 1.0, 1e6])
        return (rows * scale).sum(dim=1), (-scale).expand_as(rows).clone()

    optimizer.step(objective)
    first = optimizer.z.clone()
    rates = [optimizer.optimizer.param_groups[0]["lr"]]
    for _ in range(7):
        optimizer.step(objective)
        rates.append(optimizer.optimizer.param_groups[0]["lr"])

    assert torch.allclose(first, torch.full((2, 3), 0.1))
    assert rates == pytest.approx([0.1, 0.1, 0.01, 0.01, 1e-3, 1e-3, 1e-4, 1e-4])
    optimizer = BatchedAdamW(z, (lower, upper), lr=1.0, weight_decay=0.0, signed=True)
    optimizer.step(lambda rows, idx: (rows.sum(dim=1), torch.ones_like(rows)))
    assert float(optimizer.z.min()) == -0.25  # pushed down by 1, held at the box


def test_ig_runs_as_a_fedsim_attack_experiment() -> None:
    experiment = AttackExperiment(
        attack="ig", params={"steps": 3, "restarts": 2}, num_images=2, batch_size=2
    )

    outcome = run_attack_experiment(experiment)

    assert outcome.reconstructions[0].images.shape == (2, 3, 32, 32)
    assert outcome.reconstructions[0].details["restart_objectives"][0] < 2.0  # cosine <= 2


def test_ig_beats_one_step_dlg_on_a_two_step_fedavg_update() -> None:
    # LeNet-Zhu (U(-0.5, 0.5)), two local SGD steps on two real digits, IG
    # unrolling them (200 steps, 2 restarts) against DLG reading the update as
    # one step (20 L-BFGS steps = 400 evaluations, 2 restarts). Measured PSNR,
    # seeds 0/1/2/3: IG 14.6/12.0/14.2/13.8 dB, DLG 10.3/3.3/10.0/14.2 dB (on
    # seed 3 DLG wins by 0.4 dB; the median margin over the four is 4.2 dB).
    # Modest: a flat image of the digits' mean intensity already scores
    # 9.7/9.2/10.1/11.7 dB, so IG is 2.1-4.9 dB above "no information" at this
    # budget (SSIM 0.39-0.45) and DLG, reading the update as one step, is at
    # or below it. Seeds 0 and 1 run here; the frontier is bench/frontier.py's.
    margins = []
    for seed in (0, 1):
        observation, truth, labels = _two_step_update(seed)
        psnr = {}
        for name, budget in (
            ("ig", {"steps": 200, "restarts": 2}),
            ("dlg", {"steps": 20, "restarts": 2}),
        ):
            attack_cls = ATTACKS.get(name)
            rec = attack_cls(parse_table(attack_cls.Params, budget)).reconstruct(observation)
            psnr[name] = score_reconstruction(rec.images, truth, rec.labels, labels).psnr
        flat = truth.mean().expand_as(truth)
        baseline = score_reconstruction(flat, truth, labels, labels).psnr
        assert psnr["ig"] >= baseline + 1.5
        margins.append(psnr["ig"] - psnr["dlg"])

    assert sum(margins) / len(margins) >= 2.0
