"""The audit's records: everything scored, drawn and written, in one place.

:class:`AuditLog` receives finished work from the scheduler
(:mod:`fedsim.audit.auditor`): a reconstruction with its victim, or a leak
analysis's estimate with its victim. It scores each against the truth (the
only meeting of an attack's output and ground truth:
:func:`fedsim.audit.scoring.score_attack`,
:func:`fedsim.audit.leak_scoring.score_leak`), draws the reconstruction grids
and class representatives into ``audit/``, and writes ``audit.csv``,
``leaks.csv``, ``membership.csv`` (every candidate's score, for the ROC
curves) and ``verdict.csv``. The round's verdict over every kind of leak is
a function of those rows (:mod:`fedsim.outputs.verdict`).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from rich.console import Console

from fedsim.attacks.base import Observation, Reconstruction
from fedsim.attacks.leakage import Leak, MembershipLeak, RepresentativesLeak
from fedsim.audit.leak_scoring import LeakTruth, score_leak
from fedsim.audit.scoring import TaskRun, score_attack
from fedsim.core.components import Resolved
from fedsim.core.metrics import psnr_from_mse, ssim
from fedsim.core.protocol import AuditRecord, LeakRecord
from fedsim.core.truth import GroundTruth
from fedsim.outputs.figures import Pair, draw_pairs, save_tiles, scored_pairs
from fedsim.outputs.run_folder import (
    AUDIT_FILE,
    AUDIT_IMAGES,
    LEAKS_FILE,
    MEMBERSHIP_FILE,
    VERDICT_FILE,
    audit_image_name,
    representative_image_name,
    truth_image_name,
    write_csv_atomic,
)
from fedsim.outputs.tables import DEFAULT_SUCCESS_PSNR
from fedsim.outputs.verdict import round_verdict, verdict_line, victim_verdict

Key = tuple[int, int]  # (round, client)


def _key(row: dict[str, Any]) -> Key:
    return int(row["round"]), int(row["client"])


class AuditLog:
    """Scores, draws and writes what the audit found; thread-safe (the async collector
    and the round loop both record)."""

    checkpoint_key = "audit"

    def __init__(self, run_dir: Path, console: Console, seed: int) -> None:
        self.run_dir = run_dir
        self.console = console
        self.seed = seed
        self.rows: list[dict[str, Any]] = []  # audit.csv
        self.leak_rows: list[dict[str, Any]] = []  # leaks.csv
        self.membership_rows: list[dict[str, Any]] = []  # membership.csv
        # verdict.csv's rows by (round, client), recomputed only for victims with new rows:
        # recomputing every victim after each record grew with the square of the run.
        self._verdicts: dict[Key, dict[str, Any]] = {}
        self._stale: set[Key] = set()
        self._lock = threading.Lock()

    # -- recording -------------------------------------------------------------------

    def reconstruction(
        self,
        attack: Resolved,
        label: str,
        observation: Observation,
        truth: GroundTruth | None,
        rec: Reconstruction,
        run: TaskRun,
        counterfactual: bool = False,
    ) -> None:
        """Score and draw one attack's reconstruction of one victim (``counterfactual``: of
        the probe in an ``update`` audit)."""
        record, score, text = score_attack(attack, label, observation, truth, rec, run)
        record = replace(record, counterfactual=counterfactual)
        if record.sequences_found == record.sequences_found:  # a text attack: no pictures
            self._append(record)
            scored = (
                f"exact {record.exact_rate:.0%}, token acc. {record.token_acc:.3f}, "
                f"ROUGE-1 {record.rouge1:.3f}, ROUGE-L {record.rouge_l:.3f}"
                if text
                else "unscored (no truth source)"
            )
            self._print(observation, label, scored, record)
            return
        image = self._image(observation.round, observation.client_id, label)
        if truth is not None and score is not None:
            pairs = scored_pairs(truth.images, truth.labels, rec.images, rec.labels, score)
            draw_pairs(
                image,
                pairs,
                f"round {observation.round}, {observation.source}: {label} "
                f"({observation.threat_model}), label acc. {score.label_accuracy:.0%}",
            )
            # Tiles for the report's table: the matched reconstructions alone, the truth once.
            alone = torch.stack([p.reconstruction for p in pairs])
            save_tiles(
                alone, self._image(observation.round, observation.client_id, f"{label}-only")
            )
            save_tiles(
                truth.images.float().clamp(0, 1),
                image.with_name(truth_image_name(observation.round, observation.client_id)),
                per_row=len(truth.images),
            )
        else:  # nothing to pair with: the reconstructions alone, in one row
            save_tiles(rec.images.detach().cpu().clamp(0, 1), image, per_row=len(rec.images))
        self._append(record)
        scored = (
            f"PSNR {record.psnr:.2f} dB, SSIM {record.ssim:.3f}, labels {record.label_acc:.0%}"
            if score
            else "unscored (no truth source)"
        )
        self._print(observation, label, scored, record)

    def _append(self, record: AuditRecord) -> None:
        with self._lock:
            self.rows.append(record.to_row())
            self._stale.add((record.round, record.client))

    def _print(
        self, observation: Observation, label: str, scored: str, record: AuditRecord
    ) -> None:
        self.console.print(
            f"  audit round {observation.round}: {label} on {observation.source} "
            f"({observation.threat_model}): {scored} ({record.seconds:.1f}s)"
        )

    def leak(
        self,
        analysis: Resolved,
        observation: Observation,
        leak: Leak,
        truth: LeakTruth | None,
        candidates: int,
    ) -> LeakRecord:
        """Score one leak analysis on one client (printed with the round's verdict)."""
        record = score_leak(
            analysis, analysis.name, observation, leak, truth, self.seed, candidates
        )
        members = truth.members if truth is not None else None
        scored = [
            {
                "round": record.round,
                "client": record.client,
                "analysis": record.analysis,
                "score": float(value),
                "member": bool(member),
            }
            for value, member in zip(
                leak.scores.tolist() if isinstance(leak, MembershipLeak) else [],
                members.tolist() if members is not None else [],
                strict=False,
            )
        ]
        if isinstance(leak, RepresentativesLeak) and leak.images is not None:
            self._draw_representatives(observation, analysis.name, leak, truth)
        with self._lock:
            self.leak_rows.append(record.to_row())
            self.membership_rows.extend(scored)
            self._stale.add((record.round, record.client))
        return record

    def _image(self, server_round: int, client: int, label: str) -> Path:
        folder = self.run_dir / AUDIT_IMAGES
        folder.mkdir(exist_ok=True)
        return folder / audit_image_name(server_round, client, label)

    def _draw_representatives(
        self,
        observation: Observation,
        label: str,
        leak: RepresentativesLeak,
        truth: LeakTruth | None,
    ) -> None:
        """Each representative under its class's mean image (the mean of the victim's
        images of that class; a blank where it holds none or the truth is unknown), one
        PNG per class: the cells of the report's table per round."""
        assert leak.images is not None
        folder = self.run_dir / AUDIT_IMAGES
        folder.mkdir(exist_ok=True)
        for image, cls in zip(leak.images.detach().cpu(), leak.classes.tolist(), strict=True):
            mean = torch.zeros_like(image)
            if truth is not None and bool((truth.trained.labels == cls).any()):
                mean = truth.trained.images[truth.trained.labels == cls].float().mean(dim=0)
            shown = image.clamp(0, 1)
            psnr = psnr_from_mse(float((shown - mean).square().mean()))
            similar = ssim(shown.double().numpy(), mean.double().numpy())
            name = representative_image_name(observation.round, observation.client_id, label, cls)
            draw_pairs(
                folder / name, [Pair(mean, shown, psnr, similar, cls, cls)], upper="class mean"
            )

    # -- writing and verdicts --------------------------------------------------------

    def write(self) -> None:
        """``audit.csv``, ``leaks.csv``, ``membership.csv`` and the verdicts derived from
        them (``verdict.csv``), each rewritten whole through a rename."""
        with self._lock:
            order = [AuditRecord.column(c) for c in ("round", "client", "attack")]
            rows = sorted(self.rows, key=lambda r: tuple(r[c] for c in order))
            leaks = sorted(self.leak_rows, key=lambda r: (r["round"], r["client"], r["analysis"]))
            if rows:
                write_csv_atomic(rows, self.run_dir / AUDIT_FILE)
            if leaks:
                write_csv_atomic(leaks, self.run_dir / LEAKS_FILE)
            if self.membership_rows:
                write_csv_atomic(self.membership_rows, self.run_dir / MEMBERSHIP_FILE)
            for key in self._stale:
                attacks = pd.DataFrame([r for r in rows if _key(r) == key])
                found = pd.DataFrame([r for r in leaks if _key(r) == key])
                self._verdicts[key] = victim_verdict(attacks, found).to_row()
            self._stale.clear()
            if self._verdicts:
                verdicts = [self._verdicts[key] for key in sorted(self._verdicts)]
                write_csv_atomic(verdicts, self.run_dir / VERDICT_FILE)

    def round_verdict(self, server_round: int) -> dict[str, float]:
        """The round's verdict (``metrics.csv``'s audit columns), printed in one line."""
        self.write()
        with self._lock:
            rows = [v for (r, _), v in sorted(self._verdicts.items()) if r == server_round]
        if not rows:
            return {}
        verdicts = pd.DataFrame(rows)
        verdict = round_verdict(verdicts, server_round, self.seed, DEFAULT_SUCCESS_PSNR)
        self.console.print(verdict_line(server_round, verdict, verdicts), markup=False)
        return verdict

    # -- checkpointing (fedsim.simulation.checkpoint.Checkpointable) ---------------------

    def state_dict(self) -> dict[str, Any]:
        """Finished rows. In async mode work still running at a checkpoint is not in it:
        a resumed run does not redo it."""
        with self._lock:
            return {
                "rows": [dict(r) for r in self.rows],
                "leak_rows": [dict(r) for r in self.leak_rows],
                "membership_rows": [dict(r) for r in self.membership_rows],
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.rows = [dict(r) for r in state.get("rows", [])]
            self.leak_rows = [dict(r) for r in state.get("leak_rows", [])]
            self.membership_rows = [dict(r) for r in state.get("membership_rows", [])]
            self._verdicts = {}
            self._stale = {_key(r) for r in (*self.rows, *self.leak_rows)}
        if self.rows or self.leak_rows:
            self.write()
