"""Attacks compute at full precision: float64 on request, and CUDA as accurate as CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedsim.audit.experiment import AttackExperiment, run_attack_experiment

# The 16-image case: on an H200 with cuDNN's default TF32 convolutions
# DLG reached a median of 18.2 dB where the CPU reached 33.5 dB.
SIXTEEN_IMAGES = AttackExperiment(
    attack="dlg",
    params={"restarts": 4, "steps": 100},
    dataset="cifar100-samples",
    model="lenet-zhu",
    init="uniform",
    num_images=16,
    parallel=16,
)


def test_float64_attacks_build_double_precision_dummies() -> None:
    experiment = dataclasses.replace(
        SIXTEEN_IMAGES,
        params={"restarts": 1, "steps": 2},
        num_images=1,
        parallel=1,
        device="cpu",
        precision="float64",
    )

    outcome = run_attack_experiment(experiment)

    assert outcome.reconstructions[0].images.dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32  # restored


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_dlg_median_psnr_within_1_db_of_cpu() -> None:
    cpu = run_attack_experiment(dataclasses.replace(SIXTEEN_IMAGES, device="cpu", threads=0))
    cuda = run_attack_experiment(dataclasses.replace(SIXTEEN_IMAGES, device="cuda"))

    assert abs(cuda.medians()["psnr"] - cpu.medians()["psnr"]) <= 1.0, (
        cpu.medians(),
        cuda.medians(),
    )
