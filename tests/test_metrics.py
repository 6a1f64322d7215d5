"""The scoring module against values known in closed form."""

from __future__ import annotations

import math

import pytest
import torch

from fedsim.core.metrics import label_accuracy, match_images, psnr_from_mse, score_reconstruction


def _images(n: int = 4, channels: int = 3, size: int = 16) -> torch.Tensor:
    return torch.rand(n, channels, size, size, generator=torch.Generator().manual_seed(0))


def test_identical_images_score_infinite_psnr_and_unit_ssim() -> None:
    truth = _images()

    score = score_reconstruction(
        truth.clone(), truth, torch.tensor([1, 2, 3, 4]), torch.arange(1, 5)
    )

    assert score.mse == 0.0
    assert score.psnr == math.inf
    assert score.ssim == pytest.approx(1.0)
    assert score.label_accuracy == 1.0


def test_known_noise_level_gives_known_psnr() -> None:
    # A +-0.1 checkerboard on mid-grey: every pixel is off by exactly 0.1, so
    # MSE = 0.01 and PSNR = 10 log10(1 / 0.01) = 20 dB (peak 1).
    truth = torch.full((2, 1, 16, 16), 0.5)
    signs = (torch.arange(16)[:, None] + torch.arange(16)[None, :]) % 2 * 2 - 1
    noisy = truth + 0.1 * signs

    score = score_reconstruction(noisy, truth, torch.zeros(2), torch.zeros(2))

    assert score.mse == pytest.approx(0.01)
    assert score.psnr == pytest.approx(20.0)
    assert all(p == pytest.approx(20.0) for p in score.per_image_psnr)
    assert 0.0 < score.ssim < 1.0


def test_psnr_uses_peak_one() -> None:
    assert psnr_from_mse(1.0) == 0.0
    assert psnr_from_mse(1e-3) == pytest.approx(30.0)
    assert psnr_from_mse(0.0) == math.inf


def test_permuted_batch_is_matched_before_scoring() -> None:
    truth = _images(5)
    permutation = torch.tensor([3, 0, 4, 1, 2])
    reconstructed = truth[permutation]

    order = match_images(reconstructed, truth)
    score = score_reconstruction(reconstructed, truth, torch.arange(5), torch.arange(5))

    assert torch.equal(reconstructed[torch.as_tensor(order)], truth)
    assert score.psnr == math.inf
    assert score.assignment == tuple(int(i) for i in order)


def test_reconstructions_are_clamped_to_the_pixel_range() -> None:
    truth = torch.ones(1, 1, 16, 16)

    score = score_reconstruction(truth + 5.0, truth, torch.zeros(1), torch.zeros(1))

    assert score.psnr == math.inf


def test_label_accuracy_is_a_multiset_overlap() -> None:
    assert label_accuracy(torch.tensor([1, 2, 2]), torch.tensor([2, 1, 1])) == pytest.approx(2 / 3)
    assert label_accuracy(torch.tensor([7]), torch.tensor([3])) == 0.0


def test_shape_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match="shape mismatch"):
        score_reconstruction(_images(2), _images(3), torch.zeros(2), torch.zeros(3))
