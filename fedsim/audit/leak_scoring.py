"""Scoring a leak analysis against the truth, as one :class:`~fedsim.core.protocol.LeakRecord`.

The only place a :class:`~fedsim.attacks.leakage.Leak` meets what the victim
really trained on (:class:`LeakTruth`): its examples and labels, which
candidates were members, and its own features where the estimate is in
feature space. The numbers come from :mod:`fedsim.core.leak_metrics`.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, replace

import torch

from fedsim.attacks.base import Observation
from fedsim.attacks.leakage import (
    LabelLeak,
    Leak,
    MembershipLeak,
    RepresentativesLeak,
    WordsLeak,
)
from fedsim.core.components import Resolved
from fedsim.core.empirical_privacy import empirical_epsilon
from fedsim.core.fdp_one_run import DEFAULT_DELTA, fdp_epsilon
from fedsim.core.leak_metrics import (
    score_labels,
    score_membership,
    score_representatives,
    true_counts,
)
from fedsim.core.protocol import LeakRecord
from fedsim.core.truth import GroundTruth
from fedsim.text.words import input_tokens, score_tokens


@dataclass(frozen=True)
class LeakTruth:
    """What a victim trained on this round, for the scorer only.

    ``members``: per membership candidate, whether it was trained on;
    ``features``: the victim's own inputs of the layer a representatives
    analysis read, one row per trained example (``None``: not computed);
    ``claim``: the candidates are the one-run audit's canaries and ``members``
    their coins: the empirical epsilon (Steinke et al.'s and the f-DP one) is
    computed at this claim.
    """

    trained: GroundTruth
    members: torch.Tensor | None = None
    features: torch.Tensor | None = None
    claim: EpsilonClaim | None = None


@dataclass(frozen=True)
class EpsilonClaim:
    """The confidence and delta of the one-run audit's empirical epsilon."""

    confidence: float
    delta: float


def _counts_text(counts: torch.Tensor) -> str:
    return ";".join(str(round(float(c))) for c in counts)


def score_leak(
    analysis: Resolved,
    label: str,
    observation: Observation,
    leak: Leak,
    truth: LeakTruth | None,
    seed: int,
    candidates: int = 0,
) -> LeakRecord:
    """``leak`` (what ``analysis``, named ``label``, read from ``observation``) scored
    against ``truth``; unscored (NaN) without one. ``seed``: the attacker-side
    stream of the bootstrap intervals."""
    base = LeakRecord(
        round=observation.round,
        client=observation.client_id,
        strategy=observation.strategy,
        kind=analysis.cls.kind,
        analysis=label,
        threat_model=observation.threat_model,
        shared_kind=observation.shared_kind,
        examples=observation.num_examples,
        candidates=candidates,
        seconds=leak.seconds,
        analysis_params=analysis.params_text(),
    )
    if isinstance(leak, LabelLeak):
        return _labels(base, leak, truth)
    if isinstance(leak, MembershipLeak):
        return _membership(base, leak, truth, seed)
    if isinstance(leak, WordsLeak):
        return _words(base, leak, truth)
    return _representatives(base, leak, truth)


def _ids_text(ids: torch.Tensor) -> str:
    return ";".join(str(int(i)) for i in ids)


def _words(base: LeakRecord, leak: WordsLeak, truth: LeakTruth | None) -> LeakRecord:
    record = replace(base, words_found=len(leak.tokens), words_estimate=_ids_text(leak.tokens))
    if truth is None:
        return record
    used = input_tokens(truth.trained.images)
    score, prior = score_tokens(leak.tokens, used), score_tokens(leak.prior, used)
    return replace(
        record,
        words_true=len(used),
        words_precision=score.precision,
        words_recall=score.recall,
        words_f1=score.f1,
        words_prior_f1=prior.f1,
        words_truth=_ids_text(used),
    )


def _labels(base: LeakRecord, leak: LabelLeak, truth: LeakTruth | None) -> LeakRecord:
    record = replace(base, label_estimate=_counts_text(leak.counts))
    if truth is None:
        return record
    score = score_labels(leak.counts, truth.trained.labels, leak.prior)
    return replace(
        record,
        label_tv=score.tv_distance,
        label_tv_uniform=score.uniform_tv,
        label_tv_public=score.prior_tv,
        label_attributed=score.attributed,
        label_top_right=float(score.top_class_right),
        label_truth=_counts_text(true_counts(truth.trained.labels, len(leak.counts))),
    )


def _membership(
    base: LeakRecord, leak: MembershipLeak, truth: LeakTruth | None, seed: int
) -> LeakRecord:
    if truth is None or truth.members is None:
        return base
    score = score_membership(leak.scores, truth.members, seed)
    one, tenth = score.tpr_at[0.01], score.tpr_at[0.001]
    if truth.claim is not None:
        claim = truth.claim
        scores, coins = leak.scores.numpy(), truth.members.numpy()
        bound = empirical_epsilon(scores, coins, *astuple(claim))
        fdp = fdp_epsilon(scores, coins, claim.confidence, claim.delta or DEFAULT_DELTA)
        base = replace(
            base,
            epsilon_empirical=bound.epsilon,
            mu_empirical_fdp=fdp.mu,
            epsilon_empirical_fdp=fdp.epsilon,
        )
    return replace(
        base,
        membership_auc=score.auc.value,
        membership_auc_low=score.auc.low,
        membership_auc_high=score.auc.high,
        membership_tpr_1pct=one.value,
        membership_tpr_1pct_low=one.low,
        membership_tpr_1pct_high=one.high,
        membership_tpr_01pct=tenth.value,
        membership_tpr_01pct_low=tenth.low,
        membership_tpr_01pct_high=tenth.high,
    )


def _representatives(
    base: LeakRecord, leak: RepresentativesLeak, truth: LeakTruth | None
) -> LeakRecord:
    record = replace(
        base,
        representatives=len(leak.classes),
        representatives_classes=_ids_text(leak.classes),
        representatives_space="pixels" if leak.images is not None else "features",
        converged=leak.converged,
    )
    if truth is None or not len(leak.classes):
        return record
    score = score_representatives(
        leak.classes,
        leak.images,
        leak.features,
        truth.trained.images,
        truth.trained.labels,
        truth.features,
    )
    bar = math.nan, math.nan
    if leak.prior is not None:
        public = score_representatives(
            leak.classes, leak.prior, None, truth.trained.images, truth.trained.labels, None
        )
        bar = public.psnr_mean_image, public.ssim_mean_image
    return replace(
        record,
        representatives_psnr_public=bar[0],
        representatives_ssim_public=bar[1],
        representatives_psnr=score.psnr_mean_image,
        representatives_ssim=score.ssim_mean_image,
        representatives_psnr_nearest=score.psnr_nearest,
        representatives_ssim_nearest=score.ssim_nearest,
        representatives_cosine=score.feature_cosine,
    )
