"""Scoring and records: a reconstruction against the truth, as one :class:`AuditRecord`.

The only place an attack's output meets ground truth
(:func:`fedsim.core.metrics.score_reconstruction`), for the federation's audit
and for ``fedsim attack`` alike, so both write the same record schema.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from fedsim.attacks.base import Observation, Reconstruction
from fedsim.audit.fidelity import attacker_residual, fidelity_residual, residual_note
from fedsim.audit.tasks import DeviceUse
from fedsim.core.components import Resolved
from fedsim.core.metrics import ReconstructionScore, score_reconstruction
from fedsim.core.modality import TEXT, modality_of
from fedsim.core.protocol import AuditRecord
from fedsim.core.truth import GroundTruth
from fedsim.text.scoring import TextScore, paired_ids, score_sequences


class Scored(NamedTuple):
    """A reconstruction's record, and its score when the truth was known."""

    record: AuditRecord
    score: ReconstructionScore | None
    text: TextScore | None = None


@dataclass(frozen=True)
class TaskRun:
    """How an attack's task ran: its seed, where, and its wall time from submission."""

    seed: int
    use: DeviceUse
    wall_seconds: float


def score_attack(
    attack: Resolved,
    label: str,
    observation: Observation,
    truth: GroundTruth | None,
    rec: Reconstruction,
    run: TaskRun,
) -> Scored:
    """Score ``rec`` (what ``attack``, named ``label`` in the records, recovered from
    ``observation``) against ``truth``; unscored (NaN) without one. ``run.seed``: the
    attack task's, for the residuals (a victim batched with others may have drawn
    other random estimates of private layers, which the residual shows anyway)."""
    seed = run.seed
    if modality_of(attack.cls) == TEXT:
        return _score_text(attack, label, observation, truth, rec, run)
    score, residual = None, math.nan
    if truth is not None:
        score = score_reconstruction(rec.images, truth.images, rec.labels, truth.labels)
        residual = fidelity_residual(attack, observation, truth, seed)
    batchnorm = str(rec.details.get("batchnorm", "not-modelled"))
    nan = math.nan
    record = AuditRecord(
        **_what_ran(attack, label, observation, rec, run),
        psnr=score.psnr if score else nan,
        ssim=score.ssim if score else nan,
        mse=score.mse if score else nan,
        label_acc=score.label_accuracy if score else nan,
        images_recovered=score.recovered if score else nan,
        diverged_restarts=int(rec.details.get("diverged_restarts", 0)),
        batchnorm=batchnorm,
        fidelity_residual=residual,
        # An attack without residuals here says why (details["no_residual"]).
        fidelity_note=residual_note(residual, attack, observation, batchnorm)
        or str(rec.details.get("no_residual", "")),
        attacker_residual=attacker_residual(attack, observation, rec, seed),
    )
    return Scored(record, score)


def _what_ran(
    attack: Resolved, label: str, observation: Observation, rec: Reconstruction, run: TaskRun
) -> dict[str, Any]:
    """The record's fields that any attack fills alike: who, what was seen, how it ran."""
    return {
        "round": observation.round,
        "client": observation.client_id,
        "strategy": observation.strategy,
        "attack": label,
        "threat_model": observation.threat_model,
        "shared_kind": observation.shared_kind,
        "parameters_observed": sum(t.numel() for t in observation.shared.values()),
        "tensors_observed": len(observation.shared),
        "batch_size": observation.num_examples,
        "iterations": rec.iterations,
        "steps_taken": rec.steps_taken,
        "converged": rec.converged,
        "stop_reason": str(rec.details.get("stop_reason", "")),
        "restarts": rec.restarts,
        "final_objective": rec.final_objective,
        "seconds": rec.seconds,
        "wall_seconds": run.wall_seconds,
        "attack_params": attack.params_text(),
        "device": run.use.device,
        "gpu_seconds": run.use.gpu_seconds,
        "peak_gpu_mb": run.use.peak_gpu_mb,
    }


def _score_text(
    attack: Resolved,
    label: str,
    observation: Observation,
    truth: GroundTruth | None,
    rec: Reconstruction,
    run: TaskRun,
) -> Scored:
    """A text attack's recovered sequences against the victim's (no residuals: the
    gradient-residual model is the image attacks')."""
    nan = math.nan
    text = score_sequences(rec.images, truth.images) if truth is not None else None
    recovered, true = paired_ids(rec.images, truth.images) if truth is not None else ("", "")
    one_step = rec.details.get("one_step", True)
    record = AuditRecord(
        **_what_ran(attack, label, observation, rec, run),
        psnr=nan,
        ssim=nan,
        mse=nan,
        label_acc=nan,
        images_recovered=nan,
        diverged_restarts=0,
        batchnorm="not-modelled",
        fidelity_residual=nan,
        fidelity_note="" if one_step else "update read as one SGD step",
        attacker_residual=nan,
        exact_rate=text.exact_rate if text else nan,
        token_acc=text.token_accuracy if text else nan,
        rouge1=text.rouge1 if text else nan,
        rouge2=text.rouge2 if text else nan,
        rouge_l=text.rouge_l if text else nan,
        sequences_found=float(len(rec.images)),
        text_recovered=recovered,
        text_truth=true,
    )
    return Scored(record, None, text)
