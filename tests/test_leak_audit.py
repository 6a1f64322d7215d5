"""The audit's leak kinds: candidates, isolation from the truth, scores, verdicts, config."""

from __future__ import annotations

import dataclasses
import math
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from fedsim.attacks.base import AttackSetting
from fedsim.attacks.leakage import LeakInput
from fedsim.audit.candidates import AuditPool, draw_candidates
from fedsim.core.config import DataConfig, ScenarioError
from fedsim.core.data import load_dataset
from fedsim.core.leak_metrics import score_labels, score_membership
from fedsim.core.protocol import LeakRecord
from fedsim.core.scenario_file import load_scenario, scenario_from_dict
from fedsim.outputs.verdict import round_verdict, verdict_line, victim_verdicts
from fedsim.scenario.components import client_spec

REPO = Path(__file__).resolve().parents[1]


def _client_truth(partition: int = 0):  # type: ignore[no-untyped-def]
    from fedsim.clients.replay import ClientReplay

    scenario = load_scenario(
        REPO / "scenarios" / "quickstart.toml",
        ["data.partitioner={name='dirichlet', alpha=0.3}", "federation.num-clients=8"],
    )
    truth = ClientReplay(client_spec(scenario), "fedavg", None).update_batch(
        partition, 1, scenario.client
    )
    return scenario, truth


def test_the_pool_halves_the_held_out_split_and_no_client_trains_on_it() -> None:
    scenario, _ = _client_truth()
    bundle = load_dataset(scenario.data)
    pool = AuditPool.split(bundle.test_images, bundle.test_labels, seed=0)

    assert len(pool.public) + len(pool.non_members) == len(bundle.test_labels)
    public = {tuple(x.flatten().tolist()[::37]) for x in pool.public.images}
    outside = {tuple(x.flatten().tolist()[::37]) for x in pool.non_members.images}
    assert not public & outside
    # The clients train on the training tensors only: none of the pool is among them.
    trained = {tuple(x.flatten().tolist()[::37]) for x in bundle.train_images}
    assert not (public | outside) & trained


@pytest.mark.parametrize("dataset", ["cifar10-samples", "fashion-mnist-samples", "lfw-faces"])
def test_a_dataset_whose_test_images_are_its_training_images_has_no_held_out_split(
    dataset: str,
) -> None:
    """foolbox's 20 samples and the LFW faces are attack targets: train and test coincide,
    so the audit gets no public data and no non-members from them."""
    bundle = load_dataset(DataConfig(dataset=dataset, image_size=32))
    assert torch.equal(bundle.train_images, bundle.test_images)
    scenario = scenario_from_dict({"name": "x", "data": {"dataset": dataset, "image-size": 32}})
    assert not AttackSetting.of(scenario, None).held_out
    assert AttackSetting.of(scenario_from_dict({"name": "x"}), None).held_out


def test_candidates_keep_the_victims_class_mix_and_hide_who_is_a_member() -> None:
    scenario, truth = _client_truth()
    bundle = load_dataset(scenario.data)
    pool = AuditPool.split(bundle.test_images, bundle.test_labels, seed=0)

    candidates, members = draw_candidates(truth, pool, 100, bundle.normalization, 0, 3, 0)

    assert int(members.sum()) == int((~members).sum()) > 20
    in_labels, out_labels = candidates.labels[members], candidates.labels[~members]
    assert torch.equal(
        torch.bincount(in_labels, minlength=10), torch.bincount(out_labels, minlength=10)
    )
    pixels = bundle.normalization.to_pixels(candidates.images[members])
    trained = truth.images.flatten(1)
    for image in pixels.flatten(1):
        assert torch.cdist(image[None], trained).min() < 1e-2  # each member was trained on
    # The order says nothing: members are spread over the candidates, not first.
    assert 0.2 < members[: len(members) // 2].float().mean() < 0.8
    again, same = draw_candidates(truth, pool, 100, bundle.normalization, 0, 3, 0)
    assert torch.equal(again.images, candidates.images) and torch.equal(same, members)


def test_a_leak_input_holds_no_tensor_from_the_truth() -> None:
    """What an analysis receives (pickled as it would travel) never holds the membership
    of its candidates or the labels the victim trained on."""
    from test_audit import _observation_for, _walk

    scenario, truth = _client_truth()
    bundle = load_dataset(scenario.data)
    pool = AuditPool.split(bundle.test_images, bundle.test_labels, seed=0)
    candidates, members = draw_candidates(truth, pool, 64, bundle.normalization, 0, 1, 0)
    inputs = LeakInput(_observation_for(scenario), pool.public, candidates)

    fields = {f.name for f in dataclasses.fields(LeakInput)}
    assert not fields & {"members", "truth", "labels", "membership"}
    tensors = [t for t in _walk(pickle.loads(pickle.dumps(inputs))) if isinstance(t, torch.Tensor)]
    for tensor in tensors:
        for secret in (members.long(), members.float(), truth.labels):
            assert tensor.shape != secret.shape or not torch.equal(tensor.to(secret.dtype), secret)


def test_membership_scores_with_intervals_and_a_null_that_covers_chance() -> None:
    gen = torch.Generator().manual_seed(0)
    members = torch.arange(200) < 100
    separated = torch.where(members, 1.0, 0.0) + 0.01 * torch.randn(200, generator=gen)
    noise = torch.randn(200, generator=gen)

    strong = score_membership(separated, members, seed=1)
    null = score_membership(noise, members, seed=1)

    assert strong.auc.value == 1.0 and strong.tpr_at[0.01].value == 1.0
    assert null.auc.low < 0.5 < null.auc.high
    assert null.tpr_at[0.01].value < 0.2
    with pytest.raises(ValueError, match="members and non-members"):
        score_membership(noise, torch.ones(200, dtype=torch.bool), seed=1)


def test_the_bootstrap_auc_interval_is_that_of_each_resample_scored_by_scikit_learn() -> None:
    gen = torch.Generator().manual_seed(2)
    members = torch.arange(90) < 40
    scores = (torch.randn(90, generator=gen) + 0.5 * members).round(decimals=1)  # ties too

    got = score_membership(scores, members, seed=3, resamples=200)

    values = scores.double().numpy()
    pos, neg = values[members.numpy()], values[~members.numpy()]
    rng = np.random.default_rng(3)
    pos_b = pos[rng.integers(0, len(pos), (200, len(pos)))]
    neg_b = neg[rng.integers(0, len(neg), (200, len(neg)))]
    truth = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    aucs = [roc_auc_score(truth, np.r_[p, n]) for p, n in zip(pos_b, neg_b, strict=True)]
    low, high = np.percentile(aucs, [2.5, 97.5])
    assert (got.auc.low, got.auc.high) == pytest.approx((low, high), abs=1e-12)


def test_label_scores_against_the_uniform_guess() -> None:
    labels = torch.tensor([3] * 8 + [1] * 2)
    exact = score_labels(torch.bincount(labels, minlength=10).float(), labels)
    uniform = score_labels(torch.ones(10), labels)

    assert exact.tv_distance == 0 and exact.attributed == 1 and exact.top_class_right
    assert math.isclose(uniform.tv_distance, exact.uniform_tv)
    assert math.isclose(exact.uniform_tv, 0.5 * (0.7 + 0.1 + 8 * 0.1))


def _leak_row(client: int, kind: str, analysis: str, **scores: float) -> dict[str, object]:
    record = LeakRecord(1, client, "fedavg", kind, analysis, "update", "update", 800)
    return dataclasses.replace(record, **scores).to_row()  # type: ignore[arg-type]


def test_each_kind_takes_its_strongest_analysis_per_client_and_the_median_per_round() -> None:
    rows = [
        _leak_row(0, "labels", "weak", label_tv=0.4, label_tv_uniform=0.6),
        _leak_row(0, "labels", "strong", label_tv=0.1, label_tv_uniform=0.6),
        _leak_row(0, "membership", "loss", membership_auc=0.7, membership_tpr_1pct=0.05),
        _leak_row(0, "membership", "align", membership_auc=0.6, membership_tpr_1pct=0.2),
        _leak_row(1, "labels", "weak", label_tv=0.3, label_tv_uniform=0.5),
        _leak_row(1, "membership", "loss", membership_auc=0.5, membership_tpr_1pct=0.0),
    ]
    verdicts = victim_verdicts(pd.DataFrame(), pd.DataFrame(rows))

    first = verdicts.iloc[0]
    assert (first["label-tv"], first["label-analysis"]) == (0.1, "strong")
    assert (first["membership-auc"], first["membership-analysis"]) == (0.7, "loss")
    assert (verdicts["attacks"] == 0).all()
    metrics = round_verdict(verdicts, 1, 0, 20.0)
    assert metrics["audit-label-tv"] == pytest.approx(0.2)
    assert metrics["audit-membership-auc"] == pytest.approx(0.6)
    assert metrics["audit-victims"] == 0 and metrics["audit-leak-clients"] == 2
    line = verdict_line(1, metrics, verdicts)
    assert "labels TV 0.20" in line and "membership AUC 0.600" in line and "PSNR" not in line


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("audit.probe-rounds=[9]", "audit.probe-rounds"),
        ("audit.candidates=1", "candidates"),
        ("audit.leaks='some'", "audit.leaks"),
        ("audit.leaks=[{name='no-such-analysis'}]", "audit.leaks"),
    ],
)
def test_bad_leak_settings_are_refused_in_one_line(override: str, match: str) -> None:
    from fedsim.scenario.validate import check_components

    with pytest.raises(ScenarioError, match=match):
        check_components(load_scenario(REPO / "scenarios" / "quickstart.toml", [override]))


def test_no_leak_analyses_runs_the_attacks_alone() -> None:
    from fedsim.scenario.validate import check_components

    components = check_components(
        load_scenario(REPO / "scenarios" / "quickstart.toml", ["audit.leaks=[]"])
    )
    assert components.audit.leaks == () and components.attacks
    assert np.all([a.name for a in components.attacks])


def test_a_listed_analysis_that_cannot_apply_is_refused_before_any_work() -> None:
    from fedsim.scenario.validate import check_components

    # FedSplit uploads the classifier only: no whole-model update for membership.
    fedsplit = ["strategy.name=fedsplit", "audit.leaks=[{name='loss-drop'}]"]
    with pytest.raises(ScenarioError, match=r"audit\.leaks\[0\]") as caught:
        check_components(load_scenario(REPO / "scenarios" / "quickstart.toml", fedsplit))
    assert "\n" not in str(caught.value)
    # "auto" leaves it out there and keeps what applies.
    auto = check_components(
        load_scenario(REPO / "scenarios" / "quickstart.toml", ["strategy.name=fedsplit"])
    )
    assert "loss-drop" not in [a.name for a in auto.audit.leaks]
    assert "llg" in [a.name for a in auto.audit.leaks]
