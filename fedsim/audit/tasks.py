"""The audit's attack tasks: one attack on a batch of observations, as a Ray task.

A task receives observations only (:class:`~fedsim.attacks.base.Observation`),
never ground truth, and runs inside the audit's reservation: a placement group
of ``audit.workers`` bundles (named :data:`AUDIT_RESERVATION_NAME`) that the
simulation holds for the whole run, so client actors can never take its CPUs
or GPU share.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import ray
import torch
from rich.console import Console

from fedsim.attacks.base import Observation, PublicData, Reconstruction
from fedsim.attacks.leakage import LabelLeak, Leak, LeakInput, RepresentativesLeak
from fedsim.attacks.toolkits.analytic import AnalyticAttack
from fedsim.attacks.toolkits.output_layer import public_class_means
from fedsim.attacks.toolkits.precision import Precision, attack_precision
from fedsim.audit.progress_board import ProgressBoard
from fedsim.core.components import Resolved
from fedsim.core.config import AuditConfig
from fedsim.core.devices import gpu_if, torch_threads
from fedsim.outputs.progress import AttackProgressLines

AUDIT_RESERVATION_NAME = "fedsim-audit"
DRIVER_THREADS = 1
"""Torch's threads for the audit's work on the driver's thread (:func:`on_driver_threads`)."""

T = TypeVar("T")


def runs_in_driver(attack: Resolved) -> bool:
    """A closed-form attack (:class:`~fedsim.attacks.toolkits.analytic.AnalyticAttack`)
    runs on a thread of the driver, not as a Ray task: its milliseconds of work cost less
    than a task's round trip."""
    return issubclass(attack.cls, AnalyticAttack)


def on_driver_threads(work: Callable[[], T]) -> T:
    """``work()`` with torch on :data:`DRIVER_THREADS` threads, restored after
    (:func:`~fedsim.core.devices.torch_threads`).

    The audit's work on the driver's thread runs beside the client actors and the server's
    own evaluation, which hold the cores: loss-drop on a round of the ``shakespeare``
    scenario (8 clients) took 0.37-0.43 s on one thread, 1.0-1.7 s on two on a loaded
    2-core machine, with the same scores."""
    with torch_threads(DRIVER_THREADS):
        return work()


def reserved_workers(audit: AuditConfig, attacks: Sequence[Resolved]) -> int:
    """The Ray workers the audit reserves: ``audit.workers`` when an attack runs as a Ray
    task; none without an audit or when every attack runs in the driver."""
    as_tasks = any(not runs_in_driver(attack) for attack in attacks)
    return audit.workers if audit.enabled and as_tasks else 0


def start_board() -> Any:
    """A :class:`ProgressBoard` actor in the running Ray cluster."""
    return ray.remote(num_cpus=0)(ProgressBoard).remote()


def board_reporter(board: Any, key: str) -> Any:
    """An attack progress callback posting to ``board`` (fire and forget)."""

    def report(step: int, total: int, best: float) -> None:
        board.post.remote(key, step, total, best)

    return report


@dataclass(frozen=True)
class DeviceUse:
    """Where one attack task ran and what it held there."""

    device: str
    gpu_seconds: float  # seconds the task held its GPU (0 on CPU)
    peak_gpu_mb: float  # peak GPU memory allocated by the task (0 on CPU)


def run_attack(
    attack: Resolved,
    observations: Sequence[Observation],
    seed: int,
    want_gpu: bool,
    threads: int | None,
    precision: Precision = "float32",
    progress: tuple[Any, str] | None = None,
) -> tuple[list[Reconstruction], DeviceUse]:
    """Run one attack on ``observations`` in one batched call (the body of a Ray task,
    or of the driver's thread for closed-form attacks).

    CUDA when asked for and present (a logical GPU on a machine without CUDA
    runs on CPU), at full precision (:func:`~fedsim.attacks.toolkits.precision.attack_precision`).
    ``threads``: torch's threads in this process (``None``: left as they are, as in
    the driver, whose caller sets them: :func:`on_driver_threads`). ``progress``: a
    :class:`ProgressBoard` actor and this task's key; the attack posts its progress there.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    device = gpu_if(want_gpu)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    runner = attack.create(device=device)
    if progress is not None:
        runner.progress = board_reporter(*progress)
    with attack_precision(precision):
        recs = runner.reconstruct_many(observations, seed=seed)
    if device.type != "cuda":
        return recs, DeviceUse("cpu", 0.0, 0.0)
    torch.cuda.synchronize(device)
    peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
    return recs, DeviceUse(
        torch.cuda.get_device_name(device), time.perf_counter() - started, peak_mb
    )


def run_leak_analysis(
    analysis: Resolved, inputs: Sequence[LeakInput], seed: int, want_gpu: bool
) -> tuple[list[Leak], DeviceUse]:
    """Run one leak analysis on a round's clients in one call (on the driver's thread).

    A leak that does not time itself gets its share of the call's seconds."""
    device = gpu_if(want_gpu)
    started = time.perf_counter()
    leaks = analysis.create(device=device).analyse_many(inputs, seed=seed)
    share = (time.perf_counter() - started) / max(1, len(leaks))
    timed = [leak if leak.seconds else replace(leak, seconds=share) for leak in leaks]
    primed = [with_prior(leak, one) for leak, one in zip(timed, inputs, strict=True)]
    return primed, DeviceUse(device.type, 0.0, 0.0)


def with_prior(leak: Leak, inputs: LeakInput) -> Leak:
    """``leak`` with the data-free guess scored beside it, where it has none: the public
    class mix for labels, the public class-mean images for representatives in pixels."""
    if isinstance(leak, LabelLeak) and leak.prior is None:
        return replace(leak, prior=public_counts(inputs.public, len(leak.counts)))
    if not isinstance(leak, RepresentativesLeak) or leak.prior is not None:
        return leak
    if leak.images is not None and len(inputs.public):
        norm = inputs.observation.normalization
        return replace(leak, prior=public_class_means(inputs.public, leak.classes, norm))
    return leak


def public_counts(public: PublicData, classes: int) -> torch.Tensor:
    """The public data's examples per class: the server's data-free label prior."""
    return torch.bincount(public.labels.long().cpu(), minlength=classes).float()


# Typed Any: Ray's stubs type remote functions of at most five arguments.
remote_attack: Any = ray.remote(run_attack)


def warm_up() -> None:
    """Nothing: a task whose process, once started, has imported this module."""


remote_warm_up: Any = ray.remote(warm_up)


def audit_reservation() -> Any:
    """The running audit's placement group, or ``None`` (no plan made, e.g. in-process tests)."""
    from ray.util import get_placement_group

    if not ray.is_initialized():
        return None
    try:
        return get_placement_group(AUDIT_RESERVATION_NAME)
    except ValueError:
        return None


def finished_within(keys: Sequence[Hashable], timeout: float, every: bool) -> list[Hashable]:
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


class RemoteAttacks:
    """Submits attack tasks into the audit's reservation and prints their progress.

    The reservation (a placement group) is looked up and the progress board started
    with the first task; each task posts its progress under its key.
    """

    def __init__(self, cfg: AuditConfig, console: Console) -> None:
        self.cfg = cfg
        self.console = console
        self._reservation: Any = None
        self._board: Any = None
        self._lines: dict[str, AttackProgressLines] = {}

    def _options(self) -> dict[str, Any]:
        """A task's Ray options in the reservation; the board started on the first call."""
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
        return options

    def warm(self, workers: int) -> None:
        """Start the progress board and ``workers`` task processes now, so that their
        imports (seconds each) overlap the clients' warm-up instead of delaying the
        first audit; Ray keeps the processes for the attack tasks."""
        if not workers:
            return
        options = self._options()
        for _ in range(workers):
            remote_warm_up.options(**options).remote()

    def submit(
        self, attack: Resolved, observations: Sequence[Observation], seed: int, key: str
    ) -> Any:
        """One task running ``attack`` on ``observations``; its Ray object ref."""
        options = self._options()
        self._lines[key] = AttackProgressLines(self.console, key)
        return remote_attack.options(**options).remote(
            attack,
            observations,
            seed,
            self.cfg.num_gpus > 0,
            self.cfg.threads_per_attack,
            self.cfg.precision,
            (self._board, key),
        )

    def show_progress(self) -> None:
        """Print what running tasks posted since the last call."""
        if self._board is None:
            return
        for key, step, total, best in ray.get(self._board.take.remote()):
            self._lines[key](step, total, best)
