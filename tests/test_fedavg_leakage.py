"""Dimitrov et al.'s attack on multi-epoch FedAvg updates (``fedavg-leakage``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from client_updates import CLIENT_SEED, real_update

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.reconstruction.fedavg_leakage import FedAvgLeakage, chamfer
from fedsim.attacks.toolkits.gradients import relative_residual
from fedsim.core.config import ClientConfig, DataConfig, ModelConfig, Scenario, ScenarioError
from fedsim.core.data import load_dataset
from fedsim.core.metrics import score_reconstruction
from fedsim.core.params.matching import FedAvgLeakageParams
from fedsim.core.toml_tables import parse_table
from fedsim.core.training import batch_indices
from fedsim.scenario.applicability import check_applies
from fedsim.scenario.portfolio import RECONSTRUCTION_REACH, budget, reconstruction_refusal

BUNDLE = load_dataset(DataConfig())
MODEL = ModelConfig("lenet-zhu", "uniform")


def _update(
    cfg: ClientConfig, images: int, seed: int
) -> tuple[Observation, torch.Tensor, torch.Tensor]:
    """A client's real update on ``images`` real digits of distinct classes, and its truth."""
    return real_update(BUNDLE, MODEL, cfg, images, seed)


def test_each_epoch_gets_its_own_dummies_and_the_true_order_reproduces_the_update() -> None:
    cfg = ClientConfig(local_epochs=3, batch_size=2, optimizer="adam", lr=1e-3)
    observation, x, y = _update(cfg, images=4, seed=0)
    attack = FedAvgLeakage(FedAvgLeakageParams(adam_smoothing=0.0))
    problem = attack.build_problem([observation], seed=0, infer=False)
    params = {k: v[0] for k, v in problem.params.items()}
    # The batches in the client's real order, epoch after epoch (the attacker never has it).
    order = torch.cat(list(batch_indices(4, cfg, torch.Generator().manual_seed(CLIENT_SEED))))
    laid_out = observation.normalization.to_model(observation.normalization.to_pixels(x[order]))
    onehot = F.one_hot(y[order], 10).float()

    simulated = attack.simulated_gradient(problem, params, laid_out, onehot, functional=False)
    residual = relative_residual(simulated, [t[0] for t in problem.target])

    assert problem.image_shape[0] == 3 * 4  # three epochs' copies of the four images
    assert residual < 1e-4


def test_the_epoch_prior_does_not_depend_on_the_order_within_an_epoch() -> None:
    a, b = torch.randn(6, 20), torch.randn(6, 20)
    shuffled = a[torch.randperm(6, generator=torch.Generator().manual_seed(3))]

    assert float(chamfer(shuffled, b)) == pytest.approx(float(chamfer(a, b)), rel=1e-6)
    assert float(chamfer(a, a)) == pytest.approx(0.0, abs=1e-6)
    assert float(chamfer(a, b)) > 0.1


def test_it_refuses_a_probe_and_a_private_optimiser_state_in_one_line(
    quick_scenario_table: dict[str, object],
) -> None:
    scenario = parse_table(Scenario, quick_scenario_table, "")
    update = dataclasses.replace(
        scenario, audit=dataclasses.replace(scenario.audit, threat_model="update")
    )
    kept = dataclasses.replace(
        update,
        client=dataclasses.replace(update.client, optimizer="adam", optimizer_state="kept"),
    )
    probe = dataclasses.replace(
        scenario, audit=dataclasses.replace(scenario.audit, threat_model="probe")
    )

    FedAvgLeakage.check_setting(AttackSetting.of(update, None), "audit.attacks[0]")
    for refused, why in ((probe, "'probe' gives one batch's gradient"), (kept, "cannot know it")):
        with pytest.raises(ScenarioError, match=why):
            setting = AttackSetting.of(refused, None)
            check_applies(FedAvgLeakage, "fedavg-leakage", setting, "audit.attacks[0]")


def _recovered(name: str, observation: Observation, x: torch.Tensor, y: torch.Tensor) -> int:
    attack_cls = ATTACKS.get(name)
    # The portfolio's budget; at 40 x 2 this victim's best image stayed under 20 dB.
    params = parse_table(attack_cls.Params, {"steps": 60, "restarts": 4})
    rec = attack_cls(params).reconstruct(observation, seed=0)
    truth = observation.normalization.to_pixels(x)
    score = score_reconstruction(rec.images, truth, rec.labels, y)
    return sum(p >= 20.0 for p in score.per_image_psnr)


# Slow: every objective evaluation replays 4 local steps with second-order autograd, for
# 60 L-BFGS steps x 20 evaluations x 4 restarts x 2 attacks (seen: 76 s at load 2.5, 7 min at 8).
@pytest.mark.slow
def test_two_epochs_of_sgd_leak_more_to_fedavg_leakage_than_to_unrolled_dlg() -> None:
    # Two digits, one per step, two epochs reshuffled by the client's private seed.
    cfg = ClientConfig(local_epochs=2, batch_size=1, optimizer="sgd", lr=0.01)
    observation, x, y = _update(cfg, images=2, seed=0)

    ours = _recovered("fedavg-leakage", observation, x, y)
    baseline = _recovered("unrolled-dlg", observation, x, y)

    assert ours >= 1
    assert ours >= baseline


def test_the_portfolio_budgets_it_and_refuses_clients_beyond_the_measured_reach() -> None:
    scenario = parse_table(Scenario, {"audit": {"threat-model": "update"}}, "")

    assert budget("fedavg-leakage", AttackSetting.of(scenario, None)) == {
        "steps": 60,
        "restarts": 4,
    }
    assert reconstruction_refusal(RECONSTRUCTION_REACH) is None
    line = reconstruction_refusal(RECONSTRUCTION_REACH + 1)
    assert line is not None and f"({RECONSTRUCTION_REACH} images" in line
