"""Runs the configured attacks on intercepted updates and records the leakage.

Each (victim, attack) is one Ray task holding only the
:class:`~fedsim.attacks.base.Observation`; ground truth stays in the driver and meets
the reconstruction in :func:`fedsim.core.metrics.score_reconstruction`. Tasks ask
for no CPU but one unit of the custom ``audit`` resource (declared in
``ray.init`` by the runner) so they never wait behind Flower's client-actor
pool, which takes every CPU; ``audit.workers`` bounds how many run at once.

``sync`` mode waits for a round's attacks at the end of that round (their
mean PSNR/SSIM join that round's metrics); ``async`` mode lets training go on,
and every result is written as it completes. All are joined before the run ends.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from rich.console import Console
from torchvision.utils import make_grid, save_image

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import Observation, Reconstruction
from fedsim.core import protocol
from fedsim.core.config import AuditConfig, ComponentConfig, component_params
from fedsim.core.metrics import score_reconstruction
from fedsim.core.protocol import AuditRecord
from fedsim.core.seeds import SeedStream, choose, derive_seed
from fedsim.core.training import client_config_from_record, examples_touched
from fedsim.core.truth import GroundTruth, TruthSource
from fedsim.engine.audit.fidelity import fidelity_residual, residual_note
from fedsim.engine.audit.observe import ServerView, observe_reply, reveal_batch_statistics
from fedsim.engine.loop import RoundRecord
from fedsim.engine.results import AUDIT_FILE, AUDIT_IMAGES, write_csv_atomic

AUDIT_RESOURCE = "audit"


def run_attack(
    attack: ComponentConfig, observation: Observation, seed: int, device: str, threads: int
) -> Reconstruction:
    """Run one attack on one observation (the body of a Ray task)."""
    torch.set_num_threads(threads)
    attack_cls = ATTACKS.get(attack.name)
    params = component_params(attack_cls, attack, "audit.attacks")
    chosen = device if device == "cpu" or torch.cuda.is_available() else "cpu"
    return attack_cls(params, device=chosen).reconstruct(observation, seed=seed)


_remote_attack = ray.remote(run_attack)


@dataclass
class _Job:
    round: int
    client: int
    attack: ComponentConfig
    observation: Observation
    truth: GroundTruth | None
    submitted: float


class Auditor:
    """Chooses victims, submits attacks, scores results, writes records."""

    def __init__(
        self,
        cfg: AuditConfig,
        view: ServerView,
        truth: TruthSource | None,
        run_dir: Path,
        console: Console,
    ) -> None:
        """``truth``: where the scorer learns what victims trained on (from the
        harness, which knows the clients); without one, reconstructions are
        recorded unscored and the ``probe`` threat model is unavailable."""
        if truth is None and cfg.threat_model == "probe":
            raise ValueError(
                "the probe threat model computes client gradients: it needs a truth source"
            )
        self.cfg = cfg
        self.view = view
        self.truth = truth
        self.run_dir = run_dir
        self.console = console
        self.device = "cuda" if self.cfg.num_gpus > 0 else "cpu"
        self.rows: list[dict[str, Any]] = []
        self._pending: dict[Any, _Job] = {}
        self._lock = threading.Lock()
        self._collector: threading.Thread | None = None
        self._closing = threading.Event()

    # -- choosing and submitting -------------------------------------------------

    def victims(self, server_round: int, partitions: list[int]) -> list[int]:
        """Which of this round's repliers to attack."""
        if self.cfg.victim_ids:
            return [p for p in partitions if p in self.cfg.victim_ids]
        if self.cfg.victims == 0:
            return sorted(partitions)
        stream = SeedStream.AUDIT_VICTIMS
        return choose(partitions, self.cfg.victims, stream, self.cfg.seed, server_round)

    def observe_round(
        self,
        server_round: int,
        sent_arrays: ArrayRecord,
        sent_config: ConfigRecord,
        replies: list[Message],
    ) -> None:
        if not self.cfg.audits_round(server_round):
            return
        by_partition = {
            protocol.read_int(r.content[protocol.METRICS], protocol.PARTITION_ID): r
            for r in replies
        }
        cfg = client_config_from_record(sent_config)
        for partition in self.victims(server_round, list(by_partition)):
            reply = by_partition[partition]
            probe, truth = None, None
            if self.cfg.threat_model == "probe":
                assert self.truth is not None  # checked in __init__
                probe, truth = self.truth.probe(
                    partition, server_round, cfg, sent_arrays, self.cfg.probe_batch_size
                )
            else:
                metrics = reply.content[protocol.METRICS]
                count = examples_touched(protocol.read_int(metrics, protocol.NUM_EXAMPLES), cfg)
                if count > self.cfg.max_images:
                    self.console.print(
                        f"  audit round {server_round}: client {partition} trained on {count} "
                        f"images (> audit.max-images = {self.cfg.max_images}); skipped. Use "
                        'client.local-steps with a small batch, or threat-model = "probe".'
                    )
                    continue
                if self.truth is not None:
                    truth = self.truth.update_batch(partition, server_round, cfg)
            observation = observe_reply(
                self.view,
                server_round,
                sent_arrays,
                sent_config,
                cfg,
                reply,
                self.cfg.threat_model,
                probe,
                self.cfg.probe_batch_size,
            )
            for attack in self.cfg.attacks:
                seen = observation
                if truth is not None and attack.params.get("batchnorm") == "known":
                    seen = reveal_batch_statistics(observation, truth)  # that attacker's premise
                self._submit(_Job(server_round, partition, attack, seen, truth, 0.0))

    def _submit(self, job: _Job) -> None:
        seed = derive_seed(SeedStream.ATTACK, self.cfg.seed, job.round, job.client)
        resources = {AUDIT_RESOURCE: 1.0} if self._has_audit_resource() else {}
        task = _remote_attack.options(
            num_cpus=0 if resources else self.cfg.threads_per_attack,
            num_gpus=self.cfg.num_gpus,
            resources=resources,
        )
        job.submitted = time.perf_counter()
        ref = task.remote(
            job.attack, job.observation, seed, self.device, self.cfg.threads_per_attack
        )
        with self._lock:
            self._pending[ref] = job
        if self.cfg.mode == "async":
            self._ensure_collector()

    @staticmethod
    def _has_audit_resource() -> bool:
        return ray.cluster_resources().get(AUDIT_RESOURCE, 0) > 0

    # -- collecting --------------------------------------------------------------

    def _ensure_collector(self) -> None:
        if self._collector is None:
            self._collector = threading.Thread(target=self._collect_loop, daemon=True)
            self._collector.start()

    def _collect_loop(self) -> None:
        while not (self._closing.is_set() and not self._pending):
            self._collect(timeout=0.5)

    def _collect(self, timeout: float | None, only_round: int | None = None) -> None:
        with self._lock:
            refs = [
                ref
                for ref, job in self._pending.items()
                if only_round is None or job.round == only_round
            ]
        if not refs:
            time.sleep(0.05 if timeout else 0)
            return
        done, _ = ray.wait(refs, num_returns=len(refs) if timeout is None else 1, timeout=timeout)
        for ref in done:
            with self._lock:
                job = self._pending.pop(ref)
            self._record(job, ray.get(ref))

    def _record(self, job: _Job, rec: Reconstruction) -> None:
        obs = job.observation
        truth = job.truth
        score, residual = None, math.nan
        if truth is not None:
            score = score_reconstruction(rec.images, truth.images, rec.labels, truth.labels)
            seed = derive_seed(SeedStream.ATTACK, self.cfg.seed, job.round, job.client)
            residual = fidelity_residual(job.attack, obs, truth, seed)
        batchnorm = str(rec.details.get("batchnorm", "not-modelled"))
        record = AuditRecord(
            round=job.round,
            client=job.client,
            strategy=obs.strategy,
            attack=job.attack.name,
            threat_model=obs.threat_model,
            shared_kind=obs.shared_kind,
            parameters_observed=sum(t.numel() for t in obs.shared.values()),
            tensors_observed=len(obs.shared),
            batch_size=obs.num_examples,
            psnr=score.psnr if score else math.nan,
            ssim=score.ssim if score else math.nan,
            mse=score.mse if score else math.nan,
            label_acc=score.label_accuracy if score else math.nan,
            iterations=rec.iterations,
            restarts=rec.restarts,
            final_objective=rec.final_objective,
            seconds=rec.seconds,
            wall_seconds=time.perf_counter() - job.submitted,
            attack_params=repr(job.attack.params),
            batchnorm=batchnorm,
            fidelity_residual=residual,
            fidelity_note=residual_note(residual, job.attack, obs, batchnorm),
        )
        folder = self.run_dir / AUDIT_IMAGES
        folder.mkdir(exist_ok=True)
        images = rec.images.detach().cpu().clamp(0, 1)
        if truth is not None and score is not None:
            images = torch.cat([truth.images, images[list(score.assignment)]])
        grid = make_grid(images, nrow=obs.num_examples)
        save_image(
            grid, folder / f"round-{job.round:03d}-client-{job.client}-{job.attack.name}.png"
        )
        with self._lock:
            self.rows.append(record.to_row())
            self._write_rows()
        scored = (
            f"PSNR {record.psnr:.2f} dB, SSIM {record.ssim:.3f}, labels {record.label_acc:.0%}"
            if score
            else "unscored (no truth source)"
        )
        self.console.print(
            f"  audit round {job.round}: {job.attack.name} on client {job.client} "
            f"({obs.threat_model}): {scored} ({record.seconds:.1f}s)"
        )

    # -- loop hooks --------------------------------------------------------------

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> None:
        """Sync mode: finish this round's attacks; add their means to the round."""
        if self.cfg.mode == "sync":
            self._collect(timeout=None, only_round=record.round)
            col = AuditRecord.column
            rows = [r for r in self.rows if r[col("round")] == record.round]
            if rows:
                psnr = [r[col("psnr")] for r in rows if math.isfinite(r[col("psnr")])]
                record.server[protocol.AUDIT_PSNR] = float(np.mean(psnr)) if psnr else math.inf
                ssim = [r[col("ssim")] for r in rows]
                record.server[protocol.AUDIT_SSIM] = float(np.mean(ssim))
                labels = [r[col("label_acc")] for r in rows]
                record.server[protocol.AUDIT_LABEL_ACC] = float(np.mean(labels))

    # -- checkpointing (fedsim.engine.checkpoint.Checkpointable) ------------------------

    checkpoint_key = "audit"

    def state_dict(self) -> dict[str, Any]:
        """Finished audit rows. In async mode attacks still running at a
        checkpoint are not in it: a resumed run does not redo them."""
        with self._lock:
            return {"rows": [dict(r) for r in self.rows]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.rows = [dict(r) for r in state.get("rows", [])]
            if self.rows:
                self._write_rows()

    def _write_rows(self) -> None:
        order = [AuditRecord.column(c) for c in ("round", "client", "attack")]
        rows = sorted(self.rows, key=lambda r: tuple(r[c] for c in order))
        write_csv_atomic(rows, self.run_dir / AUDIT_FILE)

    def finish(self) -> None:
        """Join every outstanding attack (called before the run ends)."""
        self._closing.set()
        if self._collector is not None:
            self._collector.join()
        while self._pending:
            self._collect(timeout=None)
