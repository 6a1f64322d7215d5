"""Scores for the leaks besides reconstruction: labels, membership, class representatives.

Each function compares what an analysis estimated with the truth, which only
the scorer holds:

- labels: the total-variation distance between the estimated and true class
  proportions, the share of examples attributed to the right class (integer
  counts by largest remainder, overlap with the true counts), and whether the
  top class is right;
- membership: the ROC AUC and the TPR at 1 % and 0.1 % FPR (Carlini et al.,
  S&P 2022: the low-FPR regime is what matters), each with a 95 % percentile
  bootstrap interval over the candidates, members and non-members resampled
  separately (scikit-learn's ROC for the point estimate). With ``n``
  non-members the FPR moves in steps of ``1/n``: below that, a TPR "at 1 %
  FPR" is the TPR at zero false positives, and it is reported so;
- representatives: per class, PSNR and SSIM (:mod:`fedsim.core.metrics`)
  against the class's mean image and against the nearest of the victim's
  images of that class; in feature space (the extractor stayed private), the
  cosine similarity to the class's mean feature vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.metrics import roc_auc_score, roc_curve

from fedsim.core.metrics import Interval, psnr_from_mse, ssim

BOOTSTRAP_RESAMPLES = 1000
LOW_FPRS = (0.01, 0.001)


@dataclass(frozen=True)
class LabelScore:
    """How close an estimated class histogram is to the true one."""

    tv_distance: float  # 0.5 * sum |estimated - true proportions|; 0 = exact
    attributed: float  # share of examples in the right class (integer counts)
    top_class_right: bool
    uniform_tv: float  # the TV distance of a uniform guess: the no-information baseline
    prior_tv: float = math.nan  # the TV distance of ``prior`` (the public class mix), if given


def true_counts(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Examples per class, ``(K,)`` float."""
    return torch.bincount(labels.long().cpu(), minlength=num_classes).double()


def integer_counts(counts: torch.Tensor, total: int) -> torch.Tensor:
    """``counts`` scaled to sum to ``total`` and rounded by largest remainder."""
    values = counts.double().clamp_min(0)
    share = values / values.sum() if float(values.sum()) > 0 else torch.ones_like(values)
    share = share / share.sum()
    exact = share * total
    floor = exact.floor()
    missing = total - int(floor.sum())
    if missing > 0:
        floor[torch.argsort(exact - floor, descending=True)[:missing]] += 1
    return floor


def score_labels(
    estimated: torch.Tensor, labels: torch.Tensor, prior: torch.Tensor | None = None
) -> LabelScore:
    """An estimated count per class (``(K,)``) against the labels trained on; ``prior``
    (``(K,)`` shares or counts, e.g. the public data's class mix) is scored beside it."""
    truth = true_counts(labels, len(estimated))
    total = int(truth.sum())
    est = estimated.detach().double().cpu().clamp_min(0)
    est_share = est / est.sum() if float(est.sum()) > 0 else torch.full_like(est, 1 / len(est))
    true_share = truth / truth.sum()
    uniform = torch.full_like(true_share, 1 / len(true_share))
    overlap = torch.minimum(integer_counts(est, total), truth).sum()
    return LabelScore(
        tv_distance=float(0.5 * (est_share - true_share).abs().sum()),
        attributed=float(overlap) / max(1, total),
        top_class_right=bool(truth[int(est_share.argmax())] == truth.max()),
        uniform_tv=float(0.5 * (uniform - true_share).abs().sum()),
        prior_tv=math.nan if prior is None else _tv(prior, true_share),
    )


def _tv(counts: torch.Tensor, true_share: torch.Tensor) -> float:
    share = counts.detach().double().cpu().clamp_min(0)
    return float(0.5 * (share / share.sum() - true_share).abs().sum())


@dataclass(frozen=True)
class MembershipScore:
    """A membership attack's ROC summary over one candidate set."""

    auc: Interval
    tpr_at: dict[float, Interval]  # FPR -> TPR at that FPR (or below: see the module)
    members: int
    non_members: int


def _tpr_at(members: np.ndarray, non_members: np.ndarray, fpr: float) -> np.ndarray:
    """TPR at FPR <= ``fpr`` for each row: members above the non-members' threshold
    that lets at most ``floor(fpr * n)`` non-members through. Rows are resamples."""
    n = non_members.shape[-1]
    allowed = math.floor(fpr * n)
    ranked = -np.sort(-non_members, axis=-1)  # descending
    threshold = ranked[..., allowed] if allowed < n else np.full(ranked.shape[:-1], -np.inf)
    return (members > threshold[..., None]).mean(axis=-1)


def score_membership(
    scores: torch.Tensor, is_member: torch.Tensor, seed: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> MembershipScore:
    """Scores (higher = member) against the candidates' membership, with bootstrap intervals.

    ``seed`` must come from an attacker-side named stream.
    """
    values = scores.detach().double().cpu().numpy()
    member = is_member.bool().cpu().numpy()
    if member.all() or not member.any():
        raise ValueError("membership needs members and non-members among the candidates")
    pos, neg = values[member], values[~member]
    auc = float(roc_auc_score(member, values))
    fprs, tprs, _ = roc_curve(member, values)
    rng = np.random.default_rng(seed)
    pos_i = rng.integers(0, len(pos), (resamples, len(pos)))
    neg_i = rng.integers(0, len(neg), (resamples, len(neg)))
    pos_b, neg_b = pos[pos_i], neg[neg_i]
    # Each resample's AUC (Mann-Whitney; ties count one half) from the pairwise wins
    # weighted by how often it drew each candidate: ranking every resample cost more.
    wins = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    drawn_pos, drawn_neg = _draw_counts(pos_i, len(pos)), _draw_counts(neg_i, len(neg))
    auc_b = ((drawn_pos @ wins) * drawn_neg).sum(axis=1) / (len(pos) * len(neg))
    tpr_at = {}
    for fpr in LOW_FPRS:
        point = float(tprs[fprs <= fpr].max()) if (fprs <= fpr).any() else 0.0
        tpr_at[fpr] = _interval(point, _tpr_at(pos_b, neg_b, fpr), len(values))
    return MembershipScore(_interval(auc, auc_b, len(values)), tpr_at, len(pos), len(neg))


def _draw_counts(indices: np.ndarray, count: int) -> np.ndarray:
    """Per row of ``indices`` (a resample), how often it drew each of ``count`` items."""
    rows = indices.shape[0]
    flat = (indices + count * np.arange(rows)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * count).reshape(rows, count).astype(np.float64)


def _interval(point: float, resampled: np.ndarray, count: int) -> Interval:
    low, high = np.percentile(resampled, [2.5, 97.5])
    return Interval(point, float(low), float(high), count)


def roc_points(scores: torch.Tensor, is_member: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve's (FPR, TPR) points, for the report's log-scale plot."""
    fprs, tprs, _ = roc_curve(is_member.bool().cpu().numpy(), scores.double().cpu().numpy())
    return fprs, tprs


@dataclass(frozen=True)
class RepresentativeScore:
    """Class representatives against the victim's images of those classes (means over classes)."""

    classes: int  # representatives scored (of classes the victim holds)
    psnr_mean_image: float
    ssim_mean_image: float
    psnr_nearest: float
    ssim_nearest: float
    feature_cosine: float  # cosine to the class-mean feature (nan when unscored)


def score_representatives(
    classes: torch.Tensor,
    images: torch.Tensor | None,
    features: torch.Tensor | None,
    true_images: torch.Tensor,
    true_labels: torch.Tensor,
    true_features: torch.Tensor | None,
) -> RepresentativeScore:
    """Each representative against its class in the victim's data (pixel space [0, 1];
    features in the space ``features`` were read in). Classes the victim does not
    hold score 0 SSIM and 0 cosine: a representative of nothing is a miss."""
    nan = math.nan
    rows: list[tuple[float, float, float, float, float]] = []
    for i, label in enumerate(classes.tolist()):
        own = true_labels == label
        if not bool(own.any()):
            rows.append((0.0, 0.0, 0.0, 0.0, 0.0))
            continue
        psnr_m = ssim_m = psnr_n = ssim_n = cosine = nan
        if images is not None:
            rep = images[i].detach().double().cpu().clamp(0, 1)
            mine = true_images[own].detach().double().cpu().clamp(0, 1)
            mean = mine.mean(dim=0)
            psnr_m = psnr_from_mse(float((rep - mean).square().mean()))
            ssim_m = ssim(rep.numpy(), mean.numpy())
            errors = (mine - rep).square().flatten(1).mean(dim=1)
            nearest = int(errors.argmin())
            psnr_n = psnr_from_mse(float(errors[nearest]))
            ssim_n = ssim(rep.numpy(), mine[nearest].numpy())
        if features is not None and true_features is not None:
            centre = true_features[own].double().mean(dim=0).flatten()
            read = features[i].detach().double().cpu().flatten()
            cosine = float(torch.nn.functional.cosine_similarity(read, centre, dim=0))
        rows.append((psnr_m, ssim_m, psnr_n, ssim_n, cosine))
    table = np.array(rows, dtype=float) if rows else np.full((1, 5), nan)
    means = [float(np.nanmean(col)) if not np.isnan(col).all() else nan for col in table.T]
    return RepresentativeScore(len(rows), *means)
