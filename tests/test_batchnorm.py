"""BatchNorm threat models on a real ResNet-18 step over CIFAR-100 samples.

A client trains in train mode, so its BatchNorm layers normalise with the
batch's statistics and update the running buffers it uploads (FedAvg sends
the whole state dict).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fedsim.attacks import ATTACKS, resolve_attack
from fedsim.attacks.base import Observation
from fedsim.attacks.toolkits.gradients import batchnorm_view, statistics_from_buffers
from fedsim.audit.fidelity import fidelity_residual
from fedsim.audit.observe import ServerView, observe_upload, reveal_batch_statistics
from fedsim.core.config import ClientConfig, DataConfig, ModelConfig
from fedsim.core.data import load_dataset
from fedsim.core.models import InputSpec, batch_statistics, build_model
from fedsim.core.training import train_local
from fedsim.core.truth import GroundTruth

BUNDLE = load_dataset(DataConfig(dataset="cifar100-samples", image_size=16))
SPEC = InputSpec(3, 16, 100)
MODEL = ModelConfig("resnet18", "default")
EXACT = 1e-5


def _fedavg_step(count: int = 2) -> tuple[Observation, GroundTruth, dict[str, torch.Tensor]]:
    """One real train-mode SGD step; the upload (weights and buffers) as FedAvg sends it."""
    images, labels = BUNDLE.train_images[:count], BUNDLE.train_labels[:count]
    model = build_model(MODEL, SPEC, seed=0)
    sent_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    truth_stats = batch_statistics(model, images)
    cfg = ClientConfig(local_steps=1, batch_size=count, lr=0.1)
    train_local(model, images, labels, cfg, seed=0)
    uploaded = {k: v.detach().clone() for k, v in model.state_dict().items()}
    view = ServerView(MODEL, SPEC, BUNDLE.normalization, "fedavg")
    observation = observe_upload(view, sent_state, uploaded, cfg, count)
    pixels = BUNDLE.normalization.to_pixels(images)
    return observation, GroundTruth(pixels, labels), truth_stats


def test_uploaded_running_buffers_give_back_the_batch_statistics() -> None:
    observation, _, truth_stats = _fedavg_step()
    model = build_model(MODEL, SPEC)

    derived = statistics_from_buffers(observation, model)

    assert derived.keys() == truth_stats.keys()
    for key, value in truth_stats.items():
        assert torch.allclose(derived[key], value, rtol=1e-4, atol=1e-5), key


@pytest.mark.parametrize("knowledge", ["none", "buffers", "known"])
def test_every_batchnorm_knowledge_models_a_train_mode_step_exactly(knowledge: str) -> None:
    observation, truth, _ = _fedavg_step()
    if knowledge == "known":
        observation = reveal_batch_statistics(observation, truth)

    residual = fidelity_residual(
        resolve_attack("dlg", {"batchnorm": knowledge}), observation, truth, seed=0
    )

    assert residual < EXACT


def test_an_eval_mode_model_misreads_a_train_mode_update() -> None:
    # The same upload read as a probe gradient (eval mode with the sent
    # running buffers, as probe_gradient computes it) is the wrong model.
    observation, truth, _ = _fedavg_step()
    as_probe = dataclasses.replace(
        observation,
        threat_model="probe",
        shared_kind="gradient",
        shared={
            k: (observation.global_params[k] - v) / observation.train_config.lr
            for k, v in observation.shared.items()
        },
    )

    residual = fidelity_residual(resolve_attack("dlg"), as_probe, truth, seed=0)

    assert batchnorm_view(as_probe, "none") == "sent-running"
    assert residual > 0.1  # measured about 1 on this untrained ResNet-18


def test_missing_knowledge_is_refused_with_what_is_allowed() -> None:
    observation, _, _ = _fedavg_step()
    no_buffers = dataclasses.replace(observation, extra_uploads={})

    with pytest.raises(ValueError, match="needs the victim batch's statistics"):
        batchnorm_view(observation, "known")
    with pytest.raises(ValueError, match="allowed here: none, known"):
        batchnorm_view(no_buffers, "buffers")


def test_the_audit_row_names_the_batchnorm_threat_model() -> None:
    observation, truth, _ = _fedavg_step()
    known = reveal_batch_statistics(observation, truth)
    attack_cls = ATTACKS.get("ig")
    # Two restarts: the batched (vmap) objective with the statistics prior.
    params = attack_cls.Params(steps=1, restarts=2, batchnorm="buffers")

    rec = attack_cls(params).reconstruct(observation)

    assert rec.details["batchnorm"] == "uploaded-buffers"
    assert all(math.isfinite(v) for v in rec.details["restart_objectives"])
    assert batchnorm_view(observation, "none") == "batch-of-dummy"
    assert batchnorm_view(known, "known") == "known-batch"
    lenet = dataclasses.replace(observation, model=ModelConfig("lenet-zhu"))
    assert batchnorm_view(lenet, "known") == "no-batchnorm"
    assert observation.batch_statistics is None  # never added behind its back
