"""Synthetic(alpha, beta), generated per device: its statistics, against its definition.

Li et al., FedProx (MLSys 2020): per device k, u_k ~ N(0, alpha), W_k, b_k ~ N(u_k, 1);
B_k ~ N(0, beta), v_k ~ N(B_k, 1); x ~ N(v_k, Sigma), Sigma_jj = j^-1.2;
y = argmax softmax(W_k x + b_k); sizes floor(LogNormal(4, 2)) + 50 (the FedProx code).
Every number here is measured on fixed seeds; the tolerances are several standard
errors wide, so they hold for any seed.
"""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.core.config import ComponentConfig, DataConfig, ModelConfig, ScenarioError
from fedsim.core.data import load_dataset
from fedsim.core.generated import SYNTHETIC, Synthetic, SyntheticParams
from fedsim.core.models import InputSpec, build_model
from fedsim.core.partition import _GENERATED, client_data, partition_dataset
from fedsim.core.scenario_file import scenario_from_dict, scenario_to_dict
from fedsim.core.seeds import SeedStream

REPO = Path(__file__).resolve().parents[1]


def _cfg(**params: object) -> DataConfig:
    return DataConfig(dataset="synthetic", generator=ComponentConfig("synthetic", dict(params)))


def _label_tv(params: SyntheticParams, devices: int = 200, count: int = 300) -> float:
    """Mean total-variation distance of each device's label distribution from the pooled one."""
    dists = np.array(
        [
            np.bincount(
                SYNTHETIC.device_examples(params, k, count, SeedStream.GENERATED_SAMPLES)[1],
                minlength=params.classes,
            )
            / count
            for k in range(devices)
        ]
    )
    return float(0.5 * np.abs(dists - dists.mean(axis=0)).sum(axis=1).mean())


def test_logreg_is_610_parameters_on_60_features() -> None:
    model = build_model(ModelConfig("logreg"), InputSpec(60, 1, 10), seed=0)
    assert sum(p.numel() for p in model.parameters()) == 610
    assert not list(model.extractor.parameters())  # the extractor only flattens
    assert model(torch.zeros(3, 60, 1, 1)).shape == (3, 10)


def test_feature_moments_and_the_covariance_decay() -> None:
    params = SyntheticParams(alpha=0.5, beta=0.5)
    count, device = 20_000, 7
    x, _ = SYNTHETIC.device_examples(params, device, count, SeedStream.GENERATED_SAMPLES)
    sigma = np.arange(1, 61) ** -1.2
    mean, var = x.mean(axis=0), x.var(axis=0)
    # Means: v_k within 5 standard errors, feature by feature.
    assert np.all(np.abs(mean - SYNTHETIC.device(params, device).mean) < 5 * np.sqrt(sigma / count))
    # Variances: Sigma_jj within 6 % (standard error sqrt(2 / n) = 1 %).
    assert np.max(np.abs(var / sigma - 1)) < 0.06
    # The decay: the slope of log variance on log j is -1.2.
    slope = np.polyfit(np.log(np.arange(1, 61)), np.log(var), 1)[0]
    assert slope == pytest.approx(-1.2, abs=0.02)


@pytest.mark.parametrize(("scale", "expected"), [("variance", 0.5), ("std", 0.25)])
def test_device_priors(scale: str, expected: float) -> None:
    """alpha = beta = 0.5: Var(u_k) = Var(B_k) = 0.5 as variances, 0.25 as the code's std."""
    params = SyntheticParams(alpha=0.5, beta=0.5, scale=scale)  # type: ignore[arg-type]
    devices = [SYNTHETIC.device(params, k) for k in range(1000)]
    models = np.array([np.concatenate([d.weights.ravel(), d.bias]) for d in devices])
    means = np.array([d.mean for d in devices])
    # The mean of W_k's and b_k's 610 entries estimates u_k (plus noise of variance 1/610).
    assert models.mean(axis=1).var() == pytest.approx(expected + 1 / 610, abs=0.1)
    assert (models - models.mean(axis=1, keepdims=True)).var() == pytest.approx(1, abs=0.02)
    # v_k's 60 entries estimate B_k (plus 1/60).
    assert means.mean(axis=1).var() == pytest.approx(expected + 1 / 60, abs=0.1)
    assert (means - means.mean(axis=1, keepdims=True)).var() == pytest.approx(1, abs=0.03)


def test_labels_are_the_argmax_of_the_device_model() -> None:
    params = SyntheticParams(alpha=1, beta=1)
    x, y = SYNTHETIC.device_examples(params, 3, 500, SeedStream.GENERATED_SAMPLES)
    d = SYNTHETIC.device(params, 3)
    logits = torch.from_numpy(x.astype(np.float64) @ d.weights.T + d.bias)
    assert torch.equal(torch.from_numpy(y), logits.softmax(dim=1).argmax(dim=1))


def test_label_heterogeneity_grows_with_beta_and_alpha_leaves_labels_unchanged() -> None:
    """u_k adds the same amount to every class's logit (u_k * (sum x + 1)), so alpha, as the
    paper defines it, cannot move an argmax: the labels at any alpha are the labels at 0."""
    tv = {b: _label_tv(SyntheticParams(beta=b)) for b in (0.0, 1.0, 16.0)}
    assert _label_tv(SyntheticParams(iid=True)) < 0.1  # sampling noise only
    assert 0.7 < tv[0.0] < tv[1.0] < tv[16.0]
    same = [
        SYNTHETIC.device_examples(
            SyntheticParams(alpha=a, beta=0.5), 3, 2000, SeedStream.GENERATED_SAMPLES
        )[1]
        for a in (0.0, 0.5, 1.0, 4.0)
    ]
    assert all(np.mean(y == same[0]) > 0.999 for y in same)


def test_iid_shares_one_model_and_zero_mean() -> None:
    params = SyntheticParams(iid=True)
    a, b = SYNTHETIC.device(params, 0), SYNTHETIC.device(params, 99)
    assert np.array_equal(a.weights, b.weights) and np.array_equal(a.bias, b.bias)
    assert not a.mean.any()
    with pytest.raises(ScenarioError, match="must be 0 with iid"):
        SyntheticParams(iid=True, alpha=0.5)


def test_sizes_follow_the_lognormal_law() -> None:
    """floor(LogNormal(4, 2)) + 50: P(n <= m) = Phi((ln(m - 49) - 4) / 2), within KS's bound."""
    params = SyntheticParams()
    sizes = np.array([SYNTHETIC.device_size(params, k) for k in range(3000)])
    assert sizes.min() >= 50
    grid = np.unique(np.quantile(sizes, np.linspace(0.01, 0.99, 99)).astype(int))
    law = np.array(
        [0.5 * (1 + math.erf((math.log(m - 49) - 4) / (2 * math.sqrt(2)))) for m in grid]
    )
    empirical = np.array([(sizes <= m).mean() for m in grid])
    assert np.max(np.abs(empirical - law)) < 1.95 / math.sqrt(len(sizes))  # KS at 0.1 %
    assert np.median(sizes) == pytest.approx(math.exp(4) + 50, rel=0.1)


def _digest(x: np.ndarray, y: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes() + y.tobytes()).hexdigest()


# Another process, importing only the generator (no torch): device 5's examples.
ELSEWHERE = """
import hashlib
from fedsim.core.generated import SYNTHETIC, SyntheticParams
from fedsim.core.seeds import SeedStream
params = SyntheticParams(alpha=0.5, beta=0.5)
size = SYNTHETIC.device_size(params, 5)
x, y = SYNTHETIC.device_examples(params, 5, size, SeedStream.GENERATED_SAMPLES)
print(hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest())
"""


def test_a_client_is_the_same_in_another_process_and_alone() -> None:
    cfg = _cfg(alpha=0.5, beta=0.5)
    _GENERATED.clear()  # drawn afresh, not from the cache
    for other in range(5):  # other clients first: client 5 must not depend on them
        client_data(cfg, 30, 0, other)
    bundle, _ = client_data(cfg, 30, 0, 5)
    here = _digest(bundle.train_images.numpy()[:, :, 0, 0], bundle.train_labels.numpy())
    there = subprocess.run(
        [sys.executable, "-c", ELSEWHERE], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert here == there
    other, _ = client_data(cfg, 30, 0, 6)
    reseeded, _ = client_data(_cfg(alpha=0.5, beta=0.5, seed=1), 30, 0, 5)
    assert not torch.equal(other.train_images[:5], bundle.train_images[:5])
    assert not torch.equal(reseeded.train_images[:5], bundle.train_images[:5])


def test_client_split_and_server_test_set() -> None:
    cfg = _cfg(alpha=1, beta=1, **{"test-devices": 3, "test-samples": 40})
    bundle, split = client_data(cfg, 30, 0, 2)
    held = SYNTHETIC.device_size(SYNTHETIC.params(cfg), 2)
    assert bundle.train_images.shape == (held, 60, 1, 1) and bundle.num_classes == 10
    assert len(split.test) == round(0.2 * held) and len(split.train) + len(split.test) == held
    server = load_dataset(cfg)
    assert server.test_images.shape == (120, 60, 1, 1) and len(server.train_images) == 0
    assert (server.channels, server.image_size) == (60, 1)
    # Fresh draws of device 2, not its training examples.
    assert not torch.equal(server.test_images[80:85], bundle.train_images[:5])
    capped = DataConfig(
        dataset="synthetic", generator=cfg.generator, samples_per_client=20, test_fraction=0.25
    )
    small, small_split = client_data(capped, 30, 0, 2)
    assert (len(small_split.train), len(small_split.test)) == (15, 5)
    assert torch.equal(small.train_images, bundle.train_images[:20])  # a prefix of the full draw
    with pytest.raises(ValueError, match="generated per client"):
        partition_dataset(cfg, 30, 0)


def test_the_generator_table_round_trips_and_stored_datasets_refuse_it() -> None:
    from fedsim.scenario.validate import check_components

    raw = {
        "federation": {"num-clients": 100_000},
        "model": {"name": "logreg"},
        "data": {"dataset": "synthetic", "generator": {"alpha": 1.0, "beta": 1.0}},
    }
    scenario = scenario_from_dict(raw)
    assert scenario_to_dict(scenario)["data"]["generator"] == {"alpha": 1.0, "beta": 1.0}
    assert scenario_from_dict(scenario_to_dict(scenario)) == scenario
    check_components(scenario)
    stored = scenario_from_dict(
        {**raw, "data": {"dataset": "mnist-samples", "generator": {"alpha": 1}}}
    )
    with pytest.raises(ScenarioError, match="stored, not generated"):
        check_components(stored)
    with pytest.raises(ScenarioError, match="not images"):
        check_components(scenario_from_dict({**raw, "audit": {"enabled": True}}))
    with pytest.raises(ScenarioError, match="feature vectors"):
        check_components(scenario_from_dict({**raw, "model": {"name": "lenet5-grnn"}}))


def test_validating_100000_clients_generates_no_example(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsim.scenario.validate import check_machine

    calls: list[int] = []
    original = Synthetic.device_examples

    def counted(self: Synthetic, params: SyntheticParams, device: int, *rest: object) -> object:
        calls.append(device)
        return original(self, params, device, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(Synthetic, "device_examples", counted)
    scenario = scenario_from_dict(
        {
            "federation": {"num-clients": 100_000},
            "model": {"name": "logreg"},
            "backend": {"ray-cpus": 2},
            "data": {"dataset": "synthetic", "generator": {"alpha": 0.5, "beta": 0.5}},
        }
    )
    check_machine(scenario)
    assert calls == []
    with pytest.raises(ScenarioError, match="test-devices"):
        check_machine(
            scenario_from_dict({**scenario_to_dict(scenario), "federation": {"num-clients": 5}})
        )
