"""Model zoo: output shapes, the extractor/classifier split, init distributions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedsim.core.config import ModelConfig
from fedsim.core.modality import IMAGE, modality_of
from fedsim.core.models import MODELS, InputSpec, build_model


# Image models here; the text models' contract is tests/test_text.py's.
@pytest.mark.parametrize("name", [n for n in MODELS.names() if modality_of(MODELS.get(n)) == IMAGE])
@pytest.mark.parametrize("channels", [1, 3])
def test_output_shape_and_split(name: str, channels: int) -> None:
    spec = InputSpec(channels, 32, 10)
    model = build_model(ModelConfig(name, "default"), spec, seed=0)

    logits = model(torch.rand(2, channels, 32, 32))

    assert logits.shape == (2, 10)
    names = [n for n, _ in model.named_parameters()]
    assert names and all(n.startswith(("extractor.", "classifier.")) for n in names)
    assert any(n.startswith("classifier.") for n in names)


def test_paper_feature_sizes() -> None:
    spec = InputSpec(3, 32, 10)
    zhu = build_model(ModelConfig("lenet-zhu"), spec)
    fedcg = build_model(ModelConfig("lenet5-split"), spec)

    assert zhu.classifier[1].in_features == 768  # DLG: Linear(768, classes) at 32x32
    assert fedcg.extractor(torch.zeros(1, 3, 32, 32)).shape == (1, 16, 5, 5)


@pytest.mark.parametrize(("name", "count"), [("mlp-2nn", 199_210), ("cnn-fedavg", 1_663_370)])
def test_fedavg_paper_models_have_the_papers_parameter_counts(name: str, count: int) -> None:
    # McMahan et al. 2017 count at 28x28 grey digits, 10 classes ("same" padding for the CNN).
    model = build_model(ModelConfig(name), InputSpec(1, 28, 10), seed=0)

    assert sum(p.numel() for p in model.parameters()) == count
    assert model(torch.rand(3, 1, 28, 28)).shape == (3, 10)


def _conv_linear(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]


def test_uniform_init_is_uniform_half() -> None:
    model = build_model(ModelConfig("lenet5-grnn", "uniform"), InputSpec(1, 32, 10), seed=0)
    values = torch.cat([p.detach().flatten() for p in model.parameters()])

    assert values.min() >= -0.5 and values.max() <= 0.5
    assert abs(float(values.mean())) < 0.01
    assert abs(float(values.var()) - 1 / 12) < 0.003  # Var U(-a, a) = a^2 / 3


def test_xavier_normal_init_matches_fan() -> None:
    model = build_model(ModelConfig("lenet-sapag", "xavier-normal"), InputSpec(3, 32, 10), seed=0)

    for layer in _conv_linear(model):
        weight = layer.weight.detach()
        fan_in = weight[0].numel()
        fan_out = weight.shape[0] * weight[0, 0].numel()
        expected = 2.0 / (fan_in + fan_out)
        assert abs(float(weight.var()) / expected - 1) < 0.15
        assert torch.all(layer.bias == 0)


def test_seeded_build_is_deterministic() -> None:
    spec = InputSpec(1, 32, 10)
    a = build_model(ModelConfig("lenet-zhu", "uniform"), spec, seed=3)
    b = build_model(ModelConfig("lenet-zhu", "uniform"), spec, seed=3)
    c = build_model(ModelConfig("lenet-zhu", "uniform"), spec, seed=4)

    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters(), strict=True))
