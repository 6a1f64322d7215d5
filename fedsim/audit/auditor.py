"""Runs the configured attacks on intercepted updates and records the leakage.

Attacks are Ray tasks holding only observations (:class:`~fedsim.attacks.base.Observation`);
ground truth stays in the driver and meets the reconstruction in
:func:`fedsim.core.metrics.score_reconstruction`. Tasks run inside the audit's
reservation (:mod:`fedsim.simulation.resources`), a placement group of
``audit.workers`` bundles held for the whole run, so client actors can never
take their CPUs or GPU share.

A round's victims are cut into ``min(victims, audit.workers)`` tasks per
attack, each running its victims x restarts as one vmapped optimisation
(:meth:`~fedsim.attacks.base.Attack.reconstruct_many`), seeded by the round:
batching changes speed, not results (up to float rounding). On a GPU that
is one task for the round (the GPU is idle otherwise); on CPU too, batching
measured faster than one task per victim: on one thread, 8 victims of a
round in one call ran 3.9x the objective evaluations per second of one victim
at a time (``bench/dlg_throughput.py``, 10 L-BFGS steps, LeNet-Zhu), so
``audit.workers`` processes each take a batch.

Closed-form attacks (:class:`~fedsim.attacks.analytic.AnalyticAttack`: analytic-fc,
SPEAR, R-GAP) run in the driver instead, on one thread of its own beside the
server: they take milliseconds, less than a Ray task's round trip, and a worker
process would first have to import torch and fedsim (seconds). They receive the
same observations and go through the same scoring; their records say ``cpu``.
An audit of closed-form attacks alone reserves no Ray worker
(:func:`~fedsim.audit.tasks.reserved_workers`).

``sync`` mode waits for a round's attacks at the end of that round (their
mean PSNR/SSIM join that round's metrics), printing a line every
:data:`PROGRESS_EVERY_S` seconds while it waits; ``async`` mode lets training
go on, and every result is written as it completes. All are joined before the
run ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import ray
from flwr.app import ArrayRecord, ConfigRecord, Message
from rich.console import Console
from torchvision.utils import save_image

from fedsim.attacks.base import Observation, Reconstruction
from fedsim.audit.observe import ServerView, observe_reply, reveal_batch_statistics
from fedsim.audit.scoring import score_attack
from fedsim.audit.tasks import (
    DeviceUse,
    audit_reservation,
    remote_attack,
    run_attack,
    runs_in_driver,
    start_board,
)
from fedsim.core import protocol
from fedsim.core.components import Resolved
from fedsim.core.config import AuditConfig
from fedsim.core.protocol import AuditRecord, RoundRecord
from fedsim.core.seeds import SeedStream, choose, derive_seed
from fedsim.core.training import client_config_from_record, examples_touched
from fedsim.core.truth import GroundTruth, TruthSource
from fedsim.outputs.figures import draw_pairs, scored_pairs
from fedsim.outputs.progress import AttackProgressLines
from fedsim.outputs.run_folder import (
    AUDIT_FILE,
    AUDIT_IMAGES,
    VERDICT_FILE,
    audit_image_name,
    write_csv_atomic,
)
from fedsim.outputs.tables import DEFAULT_SUCCESS_PSNR
from fedsim.outputs.verdict import round_verdict, verdict_line, victim_verdict

PROGRESS_POLL = 1.0  # seconds between progress checks while waiting for attacks
PROGRESS_EVERY_S = 30.0  # a line while the round waits for its attacks: never silent


@dataclass
class _Victim:
    client: int
    observation: Observation
    truth: GroundTruth | None


@dataclass
class _Job:
    round: int
    attack: Resolved
    victims: list[_Victim]
    submitted: float

    @property
    def clients(self) -> str:
        return "client " + "/".join(str(v.client) for v in self.victims)


def _as_seen_by(attack: Resolved, victim: _Victim) -> _Victim:
    """The victim as ``attack`` observes it: an attack with ``batchnorm = "known"``
    is granted the batch statistics (its premise), no other attack is."""
    if victim.truth is not None and getattr(attack.params, "batchnorm", None) == "known":
        return replace(
            victim, observation=reveal_batch_statistics(victim.observation, victim.truth)
        )
    return victim


class Auditor:
    """Chooses victims, submits attacks, scores results, writes records."""

    def __init__(
        self,
        cfg: AuditConfig,
        attacks: Sequence[Resolved],
        view: ServerView,
        truth: TruthSource | None,
        run_dir: Path,
        console: Console,
    ) -> None:
        """``attacks``: the audit's, resolved (:func:`fedsim.scenario.portfolio.resolve_attacks`;
        ``cfg.attacks`` is not read). ``truth``: where the scorer learns what victims
        trained on (from the harness, which knows the clients); without one,
        reconstructions are recorded unscored and the ``probe`` threat model is
        unavailable."""
        if truth is None and cfg.threat_model == "probe":
            raise ValueError(
                "the probe threat model computes client gradients: it needs a truth source"
            )
        self.cfg = cfg
        self.attacks = tuple(attacks)
        self.view = view
        self.truth = truth
        self.run_dir = run_dir
        self.console = console
        self.rows: list[dict[str, Any]] = []
        # verdict.csv's rows by (round, client), recomputed only for victims with new rows:
        # recomputing every victim after each record grew with the square of the run.
        self._verdicts: dict[tuple[int, int], dict[str, Any]] = {}
        self._stale: set[tuple[int, int]] = set()
        # Ray object refs (attack tasks) or futures (closed-form attacks in the driver).
        self._pending: dict[Hashable, _Job] = {}
        self._in_driver: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._collector: threading.Thread | None = None
        self._closing = threading.Event()
        self._reservation: Any = None  # the run's audit placement group, looked up once
        self._board: Any = None  # a ProgressBoard actor, started with the first attack
        self._progress_lines: dict[str, AttackProgressLines] = {}

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
        targets: list[_Victim] = []
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
            targets.append(_Victim(partition, observation, truth))
        tasks = min(len(targets), self.cfg.workers)
        for attack in self.attacks:
            seen = [_as_seen_by(attack, victim) for victim in targets]
            for first in range(tasks):
                self._submit(_Job(server_round, attack, seen[first::tasks], 0.0))

    def _label(self, attack: Resolved) -> str:
        """The attack's name, numbered by its place in ``audit.attacks`` when the
        name occurs more than once (e.g. one attack under several threat models)."""
        names = [a.name for a in self.attacks]
        if names.count(attack.name) == 1:
            return attack.name
        return f"{attack.name}-{self.attacks.index(attack) + 1}"

    def _seed(self, server_round: int) -> int:
        return derive_seed(SeedStream.AUDIT_ATTACK, self.cfg.seed, server_round)

    def _submit(self, job: _Job) -> None:
        seed = self._seed(job.round)
        observations = [v.observation for v in job.victims]
        job.submitted = time.perf_counter()
        if runs_in_driver(job.attack):
            if self._in_driver is None:
                self._in_driver = ThreadPoolExecutor(1, thread_name_prefix="fedsim-closed-form")
            args = (job.attack, observations, seed, False, None, self.cfg.precision)
            self._add_pending(self._in_driver.submit(run_attack, *args), job)
            return
        options: dict[str, Any] = {
            "num_cpus": self.cfg.threads_per_attack,
            "num_gpus": self.cfg.num_gpus,
        }
        if self._reservation is None:
            self._reservation = audit_reservation()
        if self._reservation is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self._reservation)
        if self._board is None:
            self._board = start_board()
        key = f"audit round {job.round}: {self._label(job.attack)} on {job.clients}"
        self._progress_lines[key] = AttackProgressLines(self.console, key)
        ref = remote_attack.options(**options).remote(
            job.attack,
            observations,
            seed,
            self.cfg.num_gpus > 0,
            self.cfg.threads_per_attack,
            self.cfg.precision,
            (self._board, key),
        )
        self._add_pending(ref, job)

    def _add_pending(self, key: Hashable, job: _Job) -> None:
        with self._lock:
            self._pending[key] = job
        if self.cfg.mode == "async":
            self._ensure_collector()

    # -- collecting --------------------------------------------------------------

    def _ensure_collector(self) -> None:
        if self._collector is None:
            self._collector = threading.Thread(target=self._collect_loop, daemon=True)
            self._collector.start()

    def _collect_loop(self) -> None:
        while not (self._closing.is_set() and not self._pending):
            self._collect(timeout=0.5)

    def _show_progress(self) -> None:
        """Print what running attacks posted since the last call."""
        if self._board is None:
            return
        for key, step, total, best in ray.get(self._board.take.remote()):
            self._progress_lines[key](step, total, best)

    def _collect(self, timeout: float, only_round: int | None = None, every: bool = False) -> None:
        """Record finished tasks: the first to finish within ``timeout``, or with
        ``every`` all that finish within it. The async collector and :meth:`finish`
        may both collect: a task is recorded by whichever takes it first."""
        self._show_progress()
        with self._lock:
            keys = [
                key
                for key, job in self._pending.items()
                if only_round is None or job.round == only_round
            ]
        if not keys:
            time.sleep(0.05 if timeout else 0)
            return
        recorded = False
        for key in _finished(keys, timeout, every):
            with self._lock:
                job = self._pending.pop(key, None)
            if job is None:
                continue
            recs, use = key.result() if isinstance(key, Future) else ray.get(key)  # type: ignore[call-overload]
            share = DeviceUse(use.device, use.gpu_seconds / len(recs), use.peak_gpu_mb)
            for victim, rec in zip(job.victims, recs, strict=True):
                self._record(job, victim, rec, share)
                recorded = True
        if recorded:  # once per batch of records, not per record
            with self._lock:
                self._write_rows()

    def _wait(self, server_round: int | None) -> None:
        """Collect ``server_round``'s attacks (``None``: all), printing what still runs
        every :data:`PROGRESS_EVERY_S` seconds. Their resources are reserved, so they
        run; an attack only takes its time."""
        started = last_line = time.perf_counter()
        while True:
            self._collect(timeout=PROGRESS_POLL, only_round=server_round, every=True)
            with self._lock:
                still = [
                    j
                    for j in self._pending.values()
                    if server_round is None or j.round == server_round
                ]
            if not still:
                return
            if time.perf_counter() - last_line < PROGRESS_EVERY_S:
                continue
            last_line = time.perf_counter()
            names = ", ".join(
                f"{self._label(j.attack)} on {j.clients} (round {j.round})" for j in still[:4]
            )
            self.console.print(
                f"  audit: waiting for {len(still)} attack task(s): "
                f"{names}{', ...' if len(still) > 4 else ''}; "
                f"{time.perf_counter() - started:.0f} s",
                markup=False,
            )

    def _record(self, job: _Job, victim: _Victim, rec: Reconstruction, use: DeviceUse) -> None:
        obs, truth = victim.observation, victim.truth
        label = self._label(job.attack)
        wall = time.perf_counter() - job.submitted
        record, score = score_attack(
            job.attack, label, obs, truth, rec, self._seed(job.round), use, wall
        )
        folder = self.run_dir / AUDIT_IMAGES
        folder.mkdir(exist_ok=True)
        image = folder / audit_image_name(job.round, victim.client, label)
        if truth is not None and score is not None:
            draw_pairs(
                image,
                scored_pairs(truth.images, truth.labels, rec.images, rec.labels, score),
                f"round {job.round}, client {victim.client}: {label} "
                f"({obs.threat_model}), label acc. {score.label_accuracy:.0%}",
            )
        else:  # nothing to pair with: the reconstructions alone, in one row
            save_image(rec.images.detach().cpu().clamp(0, 1), image, nrow=len(rec.images))
        with self._lock:
            self.rows.append(record.to_row())
            self._stale.add((job.round, victim.client))
        scored = (
            f"PSNR {record.psnr:.2f} dB, SSIM {record.ssim:.3f}, labels {record.label_acc:.0%}"
            if score
            else "unscored (no truth source)"
        )
        self.console.print(
            f"  audit round {job.round}: {label} on client {victim.client} "
            f"({obs.threat_model}): {scored} ({record.seconds:.1f}s)"
        )

    # -- loop hooks --------------------------------------------------------------

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> None:
        """Sync mode: finish this round's attacks; add the round's verdict to its metrics."""
        if self.cfg.mode == "sync":
            self._wait(record.round)
            with self._lock:
                if self._stale:
                    self._write_rows()
                rows = [v for (r, _), v in sorted(self._verdicts.items()) if r == record.round]
            if rows:
                verdicts = pd.DataFrame(rows)
                verdict = round_verdict(verdicts, record.round, self.cfg.seed, DEFAULT_SUCCESS_PSNR)
                record.server.update(verdict)
                self.console.print(verdict_line(record.round, verdict, verdicts), markup=False)

    # -- checkpointing (fedsim.simulation.checkpoint.Checkpointable) ------------------------

    checkpoint_key = "audit"

    def state_dict(self) -> dict[str, Any]:
        """Finished audit rows. In async mode attacks still running at a
        checkpoint are not in it: a resumed run does not redo them."""
        with self._lock:
            return {"rows": [dict(r) for r in self.rows]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.rows = [dict(r) for r in state.get("rows", [])]
            self._verdicts, self._stale = {}, {_victim_key(r) for r in self.rows}
            if self.rows:
                self._write_rows()

    def _write_rows(self) -> None:
        """``audit.csv`` and the verdicts derived from it (``verdict.csv``); the caller
        holds the lock."""
        order = [AuditRecord.column(c) for c in ("round", "client", "attack")]
        rows = sorted(self.rows, key=lambda r: tuple(r[c] for c in order))
        write_csv_atomic(rows, self.run_dir / AUDIT_FILE)
        for key in self._stale:
            group = pd.DataFrame([r for r in rows if _victim_key(r) == key])
            self._verdicts[key] = victim_verdict(group).to_row()
        self._stale.clear()
        write_csv_atomic(
            [self._verdicts[key] for key in sorted(self._verdicts)], self.run_dir / VERDICT_FILE
        )

    def finish(self) -> None:
        """Join every outstanding attack (called before the run ends)."""
        self._closing.set()
        self._wait(None)
        if self._collector is not None:
            self._collector.join()
        if self._in_driver is not None:
            self._in_driver.shutdown()


def _victim_key(row: dict[str, Any]) -> tuple[int, int]:
    """An ``audit.csv`` row's (round, client)."""
    return int(row[AuditRecord.column("round")]), int(row[AuditRecord.column("client")])


def _finished(keys: Sequence[Hashable], timeout: float, every: bool) -> list[Hashable]:
    """Which of ``keys`` (Ray refs and futures) finished within ``timeout``: the first
    one, or with ``every`` all that did. Futures in the driver finish in
    milliseconds; when Ray tasks are pending too, the wait is Ray's."""
    futures = [k for k in keys if isinstance(k, Future)]
    refs = [k for k in keys if not isinstance(k, Future)]
    done: list[Hashable] = [f for f in futures if f.done()]
    if refs:
        wait_s = 0.0 if done and not every else timeout
        ready, _ = ray.wait(refs, num_returns=len(refs) if every else 1, timeout=wait_s)
        return done + list(ready)
    if done and not every:
        return done
    until = ALL_COMPLETED if every else FIRST_COMPLETED
    return list(wait_futures(futures, timeout=timeout, return_when=until).done)
