"""``soteria``: which gradient columns it drops, against DLG on a probe, and its refusals."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from inprocess import tiny_table

from fedsim.attacks import create_attack
from fedsim.audit.experiment import Probe, gradient_probe
from fedsim.clients.base import ClientEnv
from fedsim.clients.defences import DEFENCES, ProbeContext
from fedsim.clients.defences.soteria import Soteria, SoteriaParams, defended_linear, soteria_ratios
from fedsim.clients.replay import ClientReplay
from fedsim.core.config import DataConfig, ModelConfig, Scenario, ScenarioError
from fedsim.core.data import load_dataset
from fedsim.core.metrics import score_reconstruction
from fedsim.core.models import InputSpec, SplitNet, build_model
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.truth import probe_gradient
from fedsim.scenario.components import client_spec
from fedsim.scenario.validate import validate

RNG = np.random.default_rng(0)
SIZE = 28


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor, Any]:
    data = load_dataset(DataConfig(dataset="mnist-embedded", image_size=SIZE))
    return data.test_images, data.test_labels, data.normalization


def _model(name: str, seed: int) -> SplitNet:
    return build_model(ModelConfig(name, "uniform"), InputSpec(1, SIZE, 10), seed=seed)


def _authors_ratios(model: SplitNet, inputs: torch.Tensor) -> torch.Tensor:
    """reconstruct_image.py's loop (Sun et al.'s GS_attack), one backward per feature."""
    model.eval()
    x = inputs.clone().requires_grad_(True)
    _, layer = defended_linear(model)
    captured: list[torch.Tensor] = []
    hook = layer.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
    model(x)
    hook.remove()
    feature = captured[0]
    target = torch.zeros_like(feature)
    norm = torch.zeros_like(feature)
    for f in range(feature.size(1)):
        target[:, f] = 1
        feature.backward(target, retain_graph=True)
        assert x.grad is not None
        norm[:, f] = x.grad.view(x.size(0), -1).norm(dim=1) / (feature.data[:, f] + 0.1)
        x.grad.zero_()
        target[:, f] = 0
    return norm.sum(dim=0).detach()


@pytest.mark.parametrize("model_name", ["lenet-zhu", "cnn-fedavg"])
def test_soteria_zeroes_the_share_of_columns_and_nothing_else(
    digits: tuple[torch.Tensor, torch.Tensor, Any], model_name: str
) -> None:
    images, labels, _ = digits
    model = _model(model_name, 0)
    x, y = images[:4], labels[:4]
    names = [n for n, _ in model.named_parameters()]
    gradient = probe_gradient(model, x, y, names)
    context = ProbeContext(model, x)
    key = defended_linear(model)[0] + ".weight"

    out = Soteria(SoteriaParams(share=0.6)).protect_gradient(gradient, 4, RNG, context)
    same = Soteria(SoteriaParams(share=0.0)).protect_gradient(gradient, 4, RNG, context)

    features = gradient[key].shape[1]
    zeroed = (out[key] == 0).all(dim=0)
    assert int(zeroed.sum()) == int(0.6 * features)
    assert torch.equal(out[key][:, ~zeroed], gradient[key][:, ~zeroed])
    assert not torch.signbit(out[key]).logical_and(out[key] == 0).any()  # +0, not -0
    for name in names:
        assert torch.equal(same[name], gradient[name])
        if name != key:
            assert out[name] is gradient[name] or torch.equal(out[name], gradient[name])


def test_the_masked_features_have_the_smallest_ratios_as_the_authors_compute_them(
    digits: tuple[torch.Tensor, torch.Tensor, Any],
) -> None:
    images, _, _ = digits
    model = _model("lenet-zhu", 1)
    x = images[:3]

    keep = Soteria(SoteriaParams(share=0.6)).mask(ProbeContext(model, x))
    reference = _authors_ratios(model, x)

    assert int((~keep).sum()) == int(0.6 * len(reference))
    assert float(reference[~keep].max()) <= float(reference[keep].min())
    assert torch.allclose(soteria_ratios(model, x), reference, rtol=1e-5)


def _dlg_psnr(probe: Probe, model: SplitNet, inputs: torch.Tensor, share: float | None) -> float:
    attack = create_attack(
        "dlg", {"steps": 50, "restarts": 2, "labels": "infer", "dummy-init": "uniform"}
    )
    shared = probe.observation.shared
    if share is not None:
        context = ProbeContext(model, inputs)
        shared = Soteria(SoteriaParams(share)).protect_gradient(shared, 1, RNG, context)
    observation = dataclasses.replace(probe.observation, shared=shared)
    rec = attack.reconstruct_many([observation], seed=0)[0]
    truth = probe.truth
    return score_reconstruction(rec.images, truth.images, rec.labels, truth.labels).psnr


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_soteria_at_the_default_share_defeats_dlg_on_a_digit(
    digits: tuple[torch.Tensor, torch.Tensor, Any], seed: int
) -> None:
    # DLG (50 L-BFGS steps, 2 restarts, as tests/test_prune_quantize.py) on one real
    # 28x28 MNIST digit under LeNet-Zhu U(-0.5, 0.5). Measured on seeds 0 / 1 / 2:
    # 82.7 / 82.9 / 78.8 dB clean, 3.6 / 4.3 / 3.2 dB with soteria at share 0.6.
    images, labels, normalization = digits
    model = _model("lenet-zhu", seed)
    x, y = images[seed : seed + 1], labels[seed : seed + 1]
    spec, cfg = InputSpec(1, SIZE, 10), ModelConfig("lenet-zhu", "uniform")
    probe = gradient_probe(model, cfg, spec, x, y, normalization)

    clean = _dlg_psnr(probe, model, x, None)
    defended = _dlg_psnr(probe, model, x, SoteriaParams().share)

    assert clean >= 40.0
    assert defended <= 10.0


def _scenario(defences: list[dict[str, Any]], threat_model: str | None) -> Scenario:
    small = {
        "federation": {"num-clients": 2, "rounds": 1},
        "data": {"samples-per-client": 80},
    }
    table = tiny_table({"name": "fedavg"}, **small)
    if threat_model is not None:
        table["audit"] = {
            "enabled": True,
            "threat-model": threat_model,
            "attacks": [{"name": "dlg", "steps": 1}],
        }
    return validate(scenario_from_dict({**table, "defences": defences})).scenario


def test_the_replayed_probe_carries_soteria() -> None:
    def probe(defences: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        scenario = _scenario(defences, "probe")
        spec = client_spec(scenario)
        sent = ArrayRecord(ClientEnv.create(spec, 0, RecordDict()).model().state_dict())
        return ClientReplay(spec, "fedavg", None).probe(0, 1, scenario.client, sent, 2)[0]

    clean = probe([])
    defended = probe([{"name": "soteria"}])

    key = "classifier.1.weight"  # lenet5-split: Flatten, then the defended Linear
    zeroed = (defended[key] == 0).all(dim=0) & ~(clean[key] == 0).all(dim=0)
    assert int(zeroed.sum()) == int(0.6 * clean[key].shape[1])
    assert all(torch.equal(defended[k], clean[k]) for k in clean if k != key)


@pytest.mark.parametrize("threat_model", ["update", "aggregate", None])
def test_soteria_is_refused_outside_the_probe_threat_model(threat_model: str | None) -> None:
    with pytest.raises(ScenarioError) as err:
        _scenario([{"name": "soteria"}], threat_model)

    assert err.value.key == "defences[0]"
    assert "one shared gradient" in str(err.value)
    assert 'threat-model = "probe"' in str(err.value)
    assert "\n" not in str(err.value)


def test_soteria_under_the_probe_threat_model_validates() -> None:
    _scenario([{"name": "soteria", "share": 0.8}], "probe")


@pytest.mark.parametrize("share", [1.0, -0.1])
def test_a_bad_share_is_refused_in_one_line(share: float) -> None:
    with pytest.raises(ScenarioError) as err:
        DEFENCES.get("soteria").Params(share=share)

    assert err.value.key == "share"
    assert "\n" not in str(err.value)
