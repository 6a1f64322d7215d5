"""Reconstruction quality: the one module every scorer uses.

Images are compared in pixel space ``[0, 1]``. A reconstructed batch is
first matched to the true batch by optimal assignment (Hungarian on per-image
MSE), since attacks recover a set, not an order. PSNR uses peak 1 on
``[0, 1]``: ``10 * log10(1 / MSE)``. The GRNN authors' ``10*log10(255^2/RMSE)``
and FedCG's peak-to-peak 2 give other numbers and are not comparable.
SSIM is scikit-image's with a Gaussian window (sigma 1.5, i.e. 11 taps).

The audit's uncertainty is stated here too: a median over victims with a
percentile-bootstrap interval, and a success share with a Wilson interval,
both from scipy.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from scipy.stats import binomtest, bootstrap
from skimage.metrics import structural_similarity


@dataclass(frozen=True)
class ReconstructionScore:
    """Batch means, and the per-image values behind them (matched order)."""

    mse: float
    psnr: float
    ssim: float
    label_accuracy: float
    per_image_psnr: tuple[float, ...]
    per_image_ssim: tuple[float, ...]
    assignment: tuple[int, ...]

    @property
    def recovered(self) -> int:
        """Images recovered: PSNR >= :data:`PSNR_RECOVERED` and SSIM >= :data:`SSIM_RECOVERED`."""
        pairs = zip(self.per_image_psnr, self.per_image_ssim, strict=True)
        return sum(p >= PSNR_RECOVERED and s >= SSIM_RECOVERED for p, s in pairs)


PSNR_RECOVERED = 20.0
SSIM_RECOVERED = 0.8
"""An image counts as recovered at both (Dimitrov et al.'s share; bench/fedavg_leakage.py)."""


def psnr_from_mse(mse: float) -> float:
    """PSNR in dB with peak 1; identical images give +inf."""
    return math.inf if mse <= 0 else 10.0 * math.log10(1.0 / mse)


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM of two ``(C, H, W)`` images in [0, 1], Gaussian window sigma 1.5."""
    return float(
        structural_similarity(
            a,
            b,
            data_range=1.0,
            channel_axis=0,
            gaussian_weights=True,
            sigma=1.5,
            use_sample_covariance=False,
        )
    )


def match_images(reconstructed: torch.Tensor, truth: torch.Tensor) -> np.ndarray:
    """Index into ``reconstructed`` for each true image (Hungarian on MSE)."""
    rec = reconstructed.detach().double().flatten(1)
    tru = truth.detach().double().flatten(1)
    cost = torch.cdist(tru, rec).pow(2).numpy() / tru.shape[1]
    rows, cols = linear_sum_assignment(cost)
    return cols[np.argsort(rows)]


def label_accuracy(predicted: torch.Tensor, truth: torch.Tensor) -> float:
    """Multiset overlap: the fraction of true labels recovered, order ignored."""
    overlap = Counter(truth.tolist()) & Counter(predicted.tolist())
    return sum(overlap.values()) / max(1, len(truth))


def score_reconstruction(
    reconstructed: torch.Tensor,
    truth: torch.Tensor,
    predicted_labels: torch.Tensor,
    true_labels: torch.Tensor,
) -> ReconstructionScore:
    """Score a reconstructed batch against the truth, both ``(N, C, H, W)`` in [0, 1]."""
    if reconstructed.shape != truth.shape:
        raise ValueError(f"shape mismatch: {tuple(reconstructed.shape)} vs {tuple(truth.shape)}")
    rec = reconstructed.detach().cpu().clamp(0, 1)
    tru = truth.detach().cpu().clamp(0, 1)
    order = match_images(rec, tru)
    rec = rec[order]
    per_mse = ((rec.double() - tru.double()) ** 2).flatten(1).mean(dim=1).tolist()
    per_psnr = tuple(psnr_from_mse(m) for m in per_mse)
    per_ssim = tuple(ssim(r.numpy(), t.numpy()) for r, t in zip(rec, tru, strict=True))
    return ReconstructionScore(
        mse=float(np.mean(per_mse)),
        psnr=float(np.mean(per_psnr)),
        ssim=float(np.mean(per_ssim)),
        label_accuracy=label_accuracy(predicted_labels.cpu(), true_labels.cpu()),
        per_image_psnr=per_psnr,
        per_image_ssim=per_ssim,
        assignment=tuple(int(i) for i in order),
    )


@dataclass(frozen=True)
class Interval:
    """A point estimate with its 95 % interval (``nan`` bounds where none can be drawn)."""

    value: float
    low: float
    high: float
    count: int


EXACT_PSNR = 150.0
"""PSNRs above this (float32 rounding of an exact reconstruction, or +inf for a
bit-exact one) are read as this value in statistics, so that medians and
bootstrap percentiles stay finite."""


def median_interval(
    values: Sequence[float] | np.ndarray, seed: int, resamples: int = 2000
) -> Interval:
    """The median of ``values`` with a 95 % percentile-bootstrap interval (scipy's).

    ``seed`` must come from an attacker-side named stream. NaNs are left out;
    with fewer than two values there is no interval.
    """
    data = np.minimum(np.asarray(values, dtype=float), EXACT_PSNR)
    data = data[~np.isnan(data)]
    if len(data) == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    median = float(np.median(data))
    if len(data) < 2 or np.all(data == data[0]):
        return Interval(median, math.nan if len(data) < 2 else median, median, len(data))
    result = bootstrap(
        (data,),
        np.median,
        n_resamples=resamples,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    return Interval(median, float(ci.low), float(ci.high), len(data))


def success_interval(successes: int, trials: int) -> Interval:
    """The success share with its 95 % Wilson score interval (scipy's ``binomtest``)."""
    if trials == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    ci = binomtest(successes, trials).proportion_ci(confidence_level=0.95, method="wilson")
    return Interval(successes / trials, float(ci.low), float(ci.high), trials)
