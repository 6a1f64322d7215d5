"""The audit's scheduler: which clients to analyse, what runs where, collecting it.

Each audited round arrives as the server intercepted it, every reply read once
(:class:`~fedsim.audit.observe.InterceptedRound`). Two kinds of work run on it:

- **leak analyses** (:mod:`fedsim.attacks.leakage`: labels, membership, class
  representatives): the cheap ones on *every* client of the round, the others on
  the audit's victims, whatever the size of the update; on one driver thread
  (milliseconds to seconds: less than starting a worker process);
- **reconstruction attacks** on the victims whose update was computed on at most
  ``audit.max-images`` examples (a line names the others once per round). They
  are Ray tasks holding only observations, inside the audit's reservation (a
  placement group of ``audit.workers`` bundles held for the run,
  :mod:`fedsim.simulation.resources`), ``min(victims, audit.workers)`` tasks per
  attack, each optimising its victims x restarts as one vmapped problem
  (``bench/dlg_throughput.py``: 3.9x the evaluations per second of one at a
  time). Closed-form attacks run on the driver thread.

Under a threat model hiding replies (``aggregate``: secure aggregation's view) a round is one
observation, the example-weighted mean of its replies, analysed and attacked as one
upload on all the summed clients' examples and scored against all of them.

In ``audit.probe-rounds`` the victims are also probed, a counterfactual: the
attacks run on one batch's gradient at the sent model, which the server never
receives; its records say ``probe``.

Ground truth (:class:`~fedsim.core.truth.TruthSource`, from the harness) stays in
the driver and meets results only in :class:`~fedsim.audit.records.AuditLog`.
``sync`` mode waits for a round's work at its end and returns the round's
verdict for ``metrics.csv`` (a line every :data:`PROGRESS_EVERY_S` seconds while
it waits); ``async`` mode lets training go on. All is joined before the run ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import ray
import torch
from flwr.app import ArrayRecord
from rich.console import Console

from fedsim.attacks.base import AGGREGATE_CLIENT, Observation
from fedsim.attacks.leakage import LeakInput, PublicData, RepresentativesLeak
from fedsim.audit.canaries import CanaryAudit
from fedsim.audit.candidates import AuditPool, draw_candidates
from fedsim.audit.leak_scoring import LeakTruth
from fedsim.audit.observe import (
    InterceptedReply,
    InterceptedRound,
    ProbeGradient,
    ServerView,
    reveal_batch_statistics,
)
from fedsim.audit.records import AuditLog
from fedsim.audit.scoring import TaskRun
from fedsim.audit.tasks import (
    DeviceUse,
    RemoteAttacks,
    finished_within,
    on_driver_threads,
    run_attack,
    run_leak_analysis,
    runs_in_driver,
)
from fedsim.core.components import Resolved
from fedsim.core.config import AuditConfig
from fedsim.core.protocol import RoundRecord
from fedsim.core.seeds import SeedStream, choose, derive_seed
from fedsim.core.threat import ThreatModel
from fedsim.core.truth import GroundTruth, TruthSource

PROGRESS_POLL = 1.0  # seconds between progress checks while waiting for attacks
PROGRESS_EVERY_S = 30.0  # a line while the round waits for its attacks: never silent
SUM_STREAM = 2**32  # an aggregate's place in per-client seed streams: above every partition id


@dataclass(frozen=True)
class _Victim:
    client: int
    observation: Observation
    truth: GroundTruth | None
    # Whose data the truth holds: the client, or the clients an aggregate sums.
    partitions: tuple[int, ...]


@dataclass(frozen=True)
class _Analysed:
    """One client as a leak analysis sees it, and what its scorer knows."""

    inputs: LeakInput
    truth: LeakTruth | None
    candidates: int
    partitions: tuple[int, ...]

    @property
    def client(self) -> int:
        return self.inputs.observation.client_id


@dataclass
class _Job:
    round: int
    component: Resolved  # an attack, or a leak analysis
    victims: Sequence[_Victim | _Analysed]
    counterfactual: bool = False  # a probe in an update audit (audit.probe-rounds)
    submitted: float = 0.0

    @property
    def clients(self) -> str:
        return "client " + "/".join(str(v.client) for v in self.victims)


def _as_seen_by(attack: Resolved, victim: _Victim, pool: AuditPool | None) -> _Victim:
    """The victim as ``attack`` observes it: an attack with ``batchnorm = "known"``
    is granted the batch statistics (its premise), no other attack is; an attack that
    reads public data (:attr:`~fedsim.attacks.base.Attack.reads_public`) is granted the
    server's public half of the held-out split, no other attack is."""
    if attack.cls.reads_public and pool is not None:
        victim = replace(victim, observation=replace(victim.observation, public=pool.public))
    if victim.truth is not None and getattr(attack.params, "batchnorm", None) == "known":
        return replace(
            victim, observation=reveal_batch_statistics(victim.observation, victim.truth)
        )
    return victim


class Auditor:
    """Chooses victims, submits attacks and leak analyses, collects what they find."""

    def __init__(
        self,
        cfg: AuditConfig,
        attacks: Sequence[Resolved],
        view: ServerView,
        truth: TruthSource | None,
        run_dir: Path,
        console: Console,
        leaks: Sequence[Resolved] = (),
        probe_attacks: Sequence[Resolved] = (),
        pool: AuditPool | None = None,
        canaries: CanaryAudit | None = None,
    ) -> None:
        """``attacks``, ``leaks``, ``probe_attacks``: the audit's, resolved
        (:func:`fedsim.scenario.portfolio.resolve_audit`; ``cfg.attacks`` is not read).
        ``truth``: where the scorer learns what clients trained on (from the harness,
        which knows them); without one, results are recorded unscored and the
        ``probe`` threat model is unavailable. ``pool``: the held-out split's public
        half and non-members (:class:`~fedsim.audit.candidates.AuditPool`); leak
        analyses need it. ``canaries``: the canary client's candidates (a one-run audit)."""
        probing = cfg.threat_model.counterfactual or bool(probe_attacks)
        if truth is None and probing:
            raise ValueError(
                "the probe threat model computes client gradients: it needs a truth source"
            )
        if leaks and pool is None:
            raise ValueError("leak analyses need the server's public data: pass a pool")
        self.cfg = cfg
        self.attacks = tuple(attacks)
        self.leaks = tuple(leaks)
        self.probe_attacks = tuple(probe_attacks)
        self.view = view
        self.truth = truth
        self.pool, self.canaries = pool, canaries
        self.console = console
        self.log = AuditLog(run_dir, console, cfg.seed)
        # Ray object refs (attack tasks) or futures (work on the driver thread).
        self._pending: dict[Hashable, _Job] = {}
        self._in_driver: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._collector: threading.Thread | None = None
        self._closing = threading.Event()
        self.remote = RemoteAttacks(cfg, console)

    # -- choosing ----------------------------------------------------------------------

    def audits_round(self, server_round: int) -> bool:
        return self.cfg.audits_round(server_round) or server_round in self.cfg.probe_rounds

    def victims(self, server_round: int, partitions: list[int]) -> list[int]:
        """Which of this round's repliers to attack."""
        if self.cfg.victim_ids:
            return [p for p in partitions if p in self.cfg.victim_ids]
        if self.cfg.victims == 0:
            return sorted(partitions)
        stream = SeedStream.AUDIT_VICTIMS
        return choose(partitions, self.cfg.victims, stream, self.cfg.seed, server_round)

    def observe_round(self, intercepted: InterceptedRound) -> None:
        """Submit the round's leak analyses and attacks (see the module)."""
        server_round = intercepted.round
        chosen = self.victims(server_round, [r.partition for r in intercepted.replies])
        if self.cfg.audits_round(server_round):
            threat = self.cfg.threat_model
            every = any(a.cls.every_client for a in self.leaks)
            if threat.hides_replies:  # one observation: the round's mean
                audited, seen = [AGGREGATE_CLIENT], {AGGREGATE_CLIENT: self._sum(intercepted)}
            else:
                audited = chosen
                seen = {
                    r.partition: self._victim(intercepted, r, threat)
                    for r in intercepted.replies
                    if r.partition in chosen or every
                }
            self._submit_leaks(server_round, audited, seen)
            victims = [seen[p] for p in audited]
            self._note_unreachable(victims)
            self._submit_attacks(server_round, self.attacks, victims)
        if self.probe_attacks and server_round in self.cfg.probe_rounds:
            probe = ThreatModel.PROBE
            probed = [self._victim(intercepted, intercepted.reply(p), probe) for p in chosen]
            self._submit_attacks(server_round, self.probe_attacks, probed, counterfactual=True)

    def _victim(
        self, intercepted: InterceptedRound, reply: InterceptedReply, threat: ThreatModel
    ) -> _Victim:
        """One client's observation under ``threat``, with its truth (the scorer's)."""
        probe, truth = None, None
        if threat.counterfactual:
            assert self.truth is not None  # checked in __init__
            size = self.cfg.probe_batch_size
            sent = ArrayRecord(intercepted.sent)
            gradient, truth = self.truth.probe(
                reply.partition, intercepted.round, reply.config, sent, size
            )
            probe = ProbeGradient(gradient, size)
        elif self.truth is not None:
            truth = self.truth.update_batch(reply.partition, intercepted.round, reply.config)
        observation = self.view.observe(intercepted, reply, threat, probe)
        return _Victim(reply.partition, observation, truth, (reply.partition,))

    def _sum(self, intercepted: InterceptedRound) -> _Victim:
        """The round's aggregate as the ``aggregate`` threat model observes it; its truth
        (the scorer's) is every summed client's examples, in partition order."""
        partitions = tuple(r.partition for r in intercepted.replies)
        truth = None
        if self.truth is not None:
            batches = [
                self.truth.update_batch(r.partition, intercepted.round, r.config)
                for r in intercepted.replies
            ]
            truth = GroundTruth(
                torch.cat([b.images for b in batches]), torch.cat([b.labels for b in batches])
            )
        observation = self.view.observe_aggregate(intercepted)
        return _Victim(AGGREGATE_CLIENT, observation, truth, partitions)

    def _reach(self, attack: Resolved) -> int:
        """The most images an update ``attack`` is run on may hold: a closed-form attack's
        own exact limit, else ``audit.max-images`` (reconstruction's measured reach)."""
        return attack.cls.max_batch if runs_in_driver(attack) else self.cfg.max_images

    def _note_unreachable(self, victims: list[_Victim]) -> None:
        """One line naming the victims beyond every attack's reach this round."""
        reach = max((self._reach(a) for a in self.attacks), default=0)
        beyond = [v for v in victims if v.observation.num_examples > reach]
        if beyond and self.attacks:
            sizes = ", ".join(
                f"{v.observation.source} ({v.observation.num_examples})" for v in beyond
            )
            limits = ", ".join(f"{a.name} {self._reach(a)}" for a in self.attacks)
            self.console.print(
                f"  audit round {beyond[0].observation.round}: no reconstruction for "
                f"{sizes}: updates computed on more images than any attack here reads "
                f"({limits}; audit.max-images = {self.cfg.max_images} is the measured reach "
                "of the optimising attacks, docs/attacks.md#reach-on-real-multi-step-updates)"
                + ("; their other kinds of leak are analysed" if self.leaks else ""),
                markup=False,
            )

    # -- submitting ----------------------------------------------------------------------

    def _submit_leaks(self, server_round: int, chosen: list[int], seen: dict[int, _Victim]) -> None:
        for analysis in self.leaks:
            clients = [p for p in seen if p in chosen or analysis.cls.every_client]
            victims = [self._analysed(analysis, seen[p]) for p in clients]
            if victims:
                self._submit(_Job(server_round, analysis, victims))

    def _analysed(self, analysis: Resolved, victim: _Victim) -> _Analysed:
        """``victim`` as ``analysis`` receives it: with membership candidates if it asks."""
        assert self.pool is not None
        observation, truth = victim.observation, victim.truth
        public: PublicData = self.pool.public
        partitions = victim.partitions
        if truth is None:
            return _Analysed(LeakInput(observation, public), None, 0, partitions)
        if not analysis.cls.needs_candidates:
            return _Analysed(LeakInput(observation, public), LeakTruth(truth), 0, partitions)
        if self.canaries is not None and victim.client == self.canaries.client:
            inputs, scored = self.canaries.inputs(observation, public, truth)
            return _Analysed(inputs, scored, len(self.canaries.candidates), partitions)
        candidates, members = draw_candidates(
            truth,
            self.pool,
            self.cfg.candidates,
            self.view.normalization,
            self.cfg.seed,
            observation.round,
            SUM_STREAM if victim.client == AGGREGATE_CLIENT else victim.client,
        )
        return _Analysed(
            LeakInput(observation, public, candidates),
            LeakTruth(truth, members),
            len(candidates),
            partitions,
        )

    def _submit_attacks(
        self,
        server_round: int,
        attacks: Sequence[Resolved],
        victims: list[_Victim],
        counterfactual: bool = False,
    ) -> None:
        for attack in attacks:
            reach = self._reach(attack)
            seen = [
                _as_seen_by(attack, v, self.pool)
                for v in victims
                if v.observation.num_examples <= reach
            ]
            tasks = min(len(seen), self.cfg.workers)
            for first in range(tasks):
                self._submit(_Job(server_round, attack, seen[first::tasks], counterfactual))

    def _label(self, job: _Job) -> str:
        """The job's name in the records: its attack's, numbered by its place in
        ``audit.attacks`` when listed more than once (e.g. under several BatchNorm threat
        models), ``-probe`` after it for the counterfactual probe."""
        attack = job.component
        names = [a.name for a in self.attacks]
        label = attack.name
        if attack in self.attacks and names.count(attack.name) > 1:
            label = f"{attack.name}-{self.attacks.index(attack) + 1}"
        return f"{label}-probe" if job.counterfactual else label

    def _seed(self, server_round: int) -> int:
        return derive_seed(SeedStream.AUDIT_ATTACK, self.cfg.seed, server_round)

    def _driver(self) -> ThreadPoolExecutor:
        if self._in_driver is None:
            self._in_driver = ThreadPoolExecutor(1, thread_name_prefix="fedsim-audit")
        return self._in_driver

    def _submit(self, job: _Job) -> None:
        seed = self._seed(job.round)
        job.submitted = time.perf_counter()
        if isinstance(job.victims[0], _Analysed):
            inputs = [v.inputs for v in job.victims if isinstance(v, _Analysed)]
            leaks = partial(run_leak_analysis, job.component, inputs, seed, self.cfg.num_gpus > 0)
            self._add_pending(self._driver().submit(on_driver_threads, leaks), job)
            return
        observations = [v.observation for v in job.victims if isinstance(v, _Victim)]
        if runs_in_driver(job.component):
            args = (job.component, observations, seed, False, None, self.cfg.precision)
            closed_form = partial(run_attack, *args)
            self._add_pending(self._driver().submit(on_driver_threads, closed_form), job)
            return
        key = f"audit round {job.round}: {self._label(job)} on {job.clients}"
        ref = self.remote.submit(job.component, observations, seed, key)
        self._add_pending(ref, job)

    def _add_pending(self, key: Hashable, job: _Job) -> None:
        with self._lock:
            self._pending[key] = job
        if self.cfg.mode == "async":
            self._ensure_collector()

    # -- collecting ----------------------------------------------------------------------

    def _ensure_collector(self) -> None:
        if self._collector is None:
            self._collector = threading.Thread(target=self._collect_loop, daemon=True)
            self._collector.start()

    def _collect_loop(self) -> None:
        while not (self._closing.is_set() and not self._pending):
            self._collect(timeout=0.5)

    def _collect(self, timeout: float, only_round: int | None = None, every: bool = False) -> None:
        """Record finished work: the first to finish within ``timeout``, or with
        ``every`` all that finish within it. The async collector and :meth:`finish`
        may both collect: a job is recorded by whichever takes it first."""
        self.remote.show_progress()
        with self._lock:
            keys = [k for k, j in self._pending.items() if only_round in (None, j.round)]
        if not keys:
            time.sleep(0.05 if timeout else 0)
            return
        recorded = False
        for key in finished_within(keys, timeout, every):
            with self._lock:
                job = self._pending.pop(key, None)
            if job is None:
                continue
            results, use = key.result() if isinstance(key, Future) else ray.get(key)  # type: ignore[call-overload]
            self._record(job, results, use)
            recorded = True
        if recorded:  # once per batch of records, not per record
            self.log.write()

    def _record(self, job: _Job, results: list[Any], use: DeviceUse) -> None:
        wall = time.perf_counter() - job.submitted
        for victim, result in zip(job.victims, results, strict=True):
            if isinstance(victim, _Analysed):
                truth = self._with_features(result, victim)
                observation = victim.inputs.observation
                self.log.leak(job.component, observation, result, truth, victim.candidates)
                continue
            share = DeviceUse(use.device, use.gpu_seconds / len(results), use.peak_gpu_mb)
            run = TaskRun(self._seed(job.round), share, wall)
            self.log.reconstruction(
                job.component,
                self._label(job),
                victim.observation,
                victim.truth,
                result,
                run,
                job.counterfactual,
            )

    def _with_features(self, leak: Any, analysed: _Analysed) -> LeakTruth | None:
        """For representatives read in feature space (a private extractor), the clients'
        own features of their examples at the layer read: what the scorer compares with."""
        truth, source, observation = analysed.truth, self.truth, analysed.inputs.observation
        if not isinstance(leak, RepresentativesLeak) or leak.images is not None:
            return truth
        if truth is None or source is None or "layer" not in leak.details:
            return truth
        sent = ArrayRecord({**observation.global_params, **observation.extra_sent})
        # A probe's truth is its batch, the first examples of the round's.
        probed = observation.num_examples if observation.threat_model.counterfactual else None
        features = [
            source.layer_inputs(
                partition,
                observation.round,
                observation.train_config,
                sent,
                str(leak.details["layer"]),
                probed,
            )
            for partition in analysed.partitions
        ]
        return replace(truth, features=torch.cat(features))

    def _wait(self, server_round: int | None) -> None:
        """Collect ``server_round``'s work (``None``: all), printing what still runs
        every :data:`PROGRESS_EVERY_S` seconds. Its resources are reserved, so it
        runs; an attack only takes its time."""
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
                f"{self._label(j)} on {j.clients} (round {j.round})" for j in still[:4]
            )
            self.console.print(
                f"  audit: waiting for {len(still)} task(s): "
                f"{names}{', ...' if len(still) > 4 else ''}; "
                f"{time.perf_counter() - started:.0f} s",
                markup=False,
            )

    # -- loop hooks ----------------------------------------------------------------------

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> dict[str, float]:
        """Sync mode: finish this round's work; its verdict, for the round's metrics."""
        if self.cfg.mode != "sync" or not self.audits_round(record.round):
            return {}
        self._wait(record.round)
        return self.log.round_verdict(record.round)

    def finish(self) -> None:
        """Join every outstanding task (called before the run ends)."""
        self._closing.set()
        self._wait(None)
        if self._collector is not None:
            self._collector.join()
        if self._in_driver is not None:
            self._in_driver.shutdown()
        self.log.write()
