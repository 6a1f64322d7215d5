"""Gradient matching: the optimisation loop DLG, SAPAG and their variants share.

They optimise dummy images (and, unless labels are inferred, dummy label
logits) until what the attacker's model of the client would upload for them
matches what the server observed. A subclass gives a ``Params`` dataclass and
:meth:`GradientMatchingAttack.distance` (with, if it needs them, per-victim
constants such as SAPAG's sigma), and may override the public, stateless
extension points, each of which receives the :class:`MatchingProblem`:

- :meth:`~GradientMatchingAttack.simulated_gradient`: the attacker's model of
  the client's computation (one gradient step by default; ``unrolled-dlg``
  replays several local SGD steps with the :class:`LocalSchedule`);
- :meth:`~GradientMatchingAttack.extra_objective` and
  :meth:`~GradientMatchingAttack.victim_extras`: terms added to the distance
  and their per-victim constants (``aligned-dlg``'s feature alignment).

Restarts and victims are batched: every (victim, restart) pair is one row of
a :mod:`fedsim.attacks.optim` optimiser, and one ``torch.func.vmap`` call
evaluates all live rows. Each victim keeps the restart with the lowest final
gradient distance, which the attacker can compute (never the best PSNR, which
it cannot).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from fedsim.attacks.base import Attack, Observation, Reconstruction, require_restarts
from fedsim.attacks.convergence import ConvergenceRule, ConvergenceTracker
from fedsim.attacks.gradients import (
    BatchNormKnowledge,
    batch_gradient,
    batchnorm_targets,
    batchnorm_view,
    local_steps_taken,
    relative_residual,
    soft_cross_entropy,
    target_gradient,
    victim_model,
)
from fedsim.attacks.labels import BatchLabels, infer_labels, label_method, require_inferred
from fedsim.attacks.optim import BatchedAdamW, BatchedLBFGS, BatchedOptimizer
from fedsim.attacks.replay import Batch, local_batches, replay, replay_refusal
from fedsim.core.config import ClientConfig, require
from fedsim.core.models import SplitNet, recording_batch_statistics
from fedsim.core.seeds import SeedStream, derive_seed

OptimizerName = Literal["lbfgs", "adamw"]
DEFAULT_LR: dict[str, float] = {"lbfgs": 1.0, "adamw": 1e-3}


@dataclass(frozen=True)
class MatchingParams:
    """Hyper-parameters every gradient-matching attack takes.

    Attributes
    ----------
    restarts:
        Dummy initialisations per victim; the one with the lowest final
        gradient distance is kept (a single run often diverges or stalls).
    steps:
        Optimiser steps; ``None`` takes the paper's count for ``optimizer``.
    optimizer:
        ``lbfgs`` (PyTorch's defaults, no line search) or ``adamw``.
    lr:
        Learning rate; ``None`` gives 1 for L-BFGS and 1e-3 for AdamW.
    lbfgs_iterations:
        Inner iterations (and objective evaluations) per L-BFGS step.
    history_size:
        L-BFGS curvature pairs kept.
    weight_decay:
        AdamW's decoupled weight decay.
    dummy_init:
        ``normal`` (N(0, 1) in model-input space), ``uniform`` (over the data
        range) or ``constant`` (``dummy_constant`` as a pixel value).
    dummy_constant:
        The pixel value of a ``constant`` dummy, in [0, 1].
    clamp:
        Clamp the dummy into the data range: ``off``; after every optimiser
        ``step`` (between ``torch.optim.LBFGS.step`` calls, as DLG-derived code
        does); or after every ``iteration`` (each L-BFGS inner update,
        projected L-BFGS; the same as ``step`` for AdamW).
    labels:
        ``joint``: optimise soft labels with the images (DLG). ``infer``: read
        them from the last layer's gradient first (iDLG at batch 1,
        ``batch_labels`` for batches; see :mod:`fedsim.attacks.labels`) and
        keep them fixed.
    batch_labels:
        How ``labels = "infer"`` reads a batch's labels: ``count``
        (bias-corrected counting) or ``ilrg`` (iLRG, Ma et al. 2023).
    signed_gradient:
        AdamW steps on the sign of the objective's gradient (Inverting Gradients).
    step_decay:
        AdamW's learning rate drops tenfold at 3/8, 5/8 and 7/8 of the steps.
    batchnorm:
        What the attacker knows of the victim's BatchNorm statistics:
        ``none``, ``buffers`` or ``known`` (see
        :data:`~fedsim.attacks.gradients.BatchNormKnowledge`).
    batchnorm_weight:
        Weight of the prior ``sum_l ||mu_l(x') - mu_l|| + ||var_l(x') - var_l||``
        pulling the dummy's BatchNorm statistics to the believed ones
        (DeepInversion's form; not tuned here).
    convergence:
        When a restart counts as converged, and whether the attack stops
        once every restart has (:mod:`fedsim.attacks.convergence`).
    """

    paper_steps: ClassVar[dict[str, int]] = {"lbfgs": 300, "adamw": 20_000}

    restarts: int = 4
    steps: int | None = None
    optimizer: OptimizerName = "lbfgs"
    lr: float | None = None
    lbfgs_iterations: int = 20
    history_size: int = 100
    weight_decay: float = 0.01
    dummy_init: Literal["normal", "uniform", "constant"] = "normal"
    dummy_constant: float = 0.5
    clamp: Literal["off", "step", "iteration"] = "off"
    labels: Literal["joint", "infer"] = "joint"
    batch_labels: BatchLabels = "count"
    signed_gradient: bool = False
    step_decay: bool = False
    batchnorm: BatchNormKnowledge = "none"
    batchnorm_weight: float = 0.01
    convergence: ConvergenceRule = field(default_factory=ConvergenceRule)

    def __post_init__(self) -> None:
        require_restarts(self.restarts)
        require_inferred(self.labels, self.batch_labels)
        require(self.steps is None or self.steps >= 1, "steps", self.steps, "must be >= 1")
        require(self.lr is None or self.lr > 0, "lr", self.lr, "must be > 0")
        require(
            self.lbfgs_iterations >= 1, "lbfgs-iterations", self.lbfgs_iterations, "must be >= 1"
        )
        require(self.history_size >= 1, "history-size", self.history_size, "must be >= 1")
        require(self.weight_decay >= 0, "weight-decay", self.weight_decay, "must be >= 0")
        require(
            self.batchnorm_weight >= 0, "batchnorm-weight", self.batchnorm_weight, "must be >= 0"
        )
        require(
            0 <= self.dummy_constant <= 1,
            "dummy-constant",
            self.dummy_constant,
            "must be in [0, 1]",
        )

    @property
    def step_count(self) -> int:
        """``steps``, or the paper's count for the chosen optimiser."""
        return self.steps if self.steps is not None else self.paper_steps[self.optimizer]

    @property
    def learning_rate(self) -> float:
        """``lr``, or the paper's rate for the chosen optimiser."""
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]


@dataclass(frozen=True)
class LocalSchedule:
    """The client's local training as the attacker models it, from the public config."""

    lr: float
    steps: int  # optimiser steps the client took
    batch_size: int
    proximal_mu: float = 0.0  # FedProx's (mu/2)||w - w_global||^2, sent in the config
    client: ClientConfig = field(default_factory=ClientConfig)  # optimiser and epochs
    num_examples: int = 1

    @classmethod
    def of(cls, observation: Observation) -> LocalSchedule:
        cfg = observation.train_config
        return cls(
            cfg.lr,
            local_steps_taken(observation),
            cfg.batch_size,
            observation.proximal_mu,
            cfg,
            observation.num_examples,
        )

    @property
    def batches(self) -> list[Batch]:
        """Each local step's minibatch (epoch and slots; the order within is unknown)."""
        return local_batches(self.num_examples, self.client)

    @property
    def epochs(self) -> int:
        """Epochs the local training began (a shuffle each)."""
        return self.batches[-1].epoch + 1


@dataclass(frozen=True)
class MatchingProblem:
    """Observations attacked together: same architecture, shared layers, batch shape, schedule.

    Per-victim tensors are stacked on a leading victim dimension; the hooks of
    :class:`GradientMatchingAttack` see one victim's slice at a time.
    """

    model: SplitNet
    names: list[str]  # shared parameter names, the layers matched
    params: dict[str, torch.Tensor]  # every parameter, stacked over victims (or one copy)
    shared_model: bool  # every victim received the same global model
    target: list[torch.Tensor]  # observed gradients, stacked over victims
    constants: list[torch.Tensor]  # the distance's per-victim constants, stacked
    extras: dict[str, torch.Tensor]  # extra terms' per-victim constants, stacked
    labels: torch.Tensor | None  # fixed one-hot targets (V, B, K), or None when joint
    image_shape: tuple[int, int, int, int]  # (B, C, H, W)
    num_classes: int
    schedule: LocalSchedule
    shared_kind: str  # a SharedKind: a probe's gradient or a client's reply
    batchnorm: str  # how the attacker's model normalises (gradients.batchnorm_view)


def layer_depths(model: SplitNet, names: Sequence[str]) -> list[int]:
    """1-based depth of the layer each parameter in ``names`` belongs to.

    A layer is a module owning parameters (a conv's weight and bias share a
    depth); depth counts them in forward order over the whole model, so a
    shared classifier keeps its true depth when the extractor is private.
    """
    modules = list(dict.fromkeys(n.rpartition(".")[0] for n, _ in model.named_parameters()))
    return [modules.index(n.rpartition(".")[0]) + 1 for n in names]


class GradientMatchingAttack(Attack):
    """Reconstruct a batch by matching its gradient; subclasses give the distance."""

    Params: ClassVar[type[MatchingParams]] = MatchingParams
    params: MatchingParams

    @staticmethod
    @abstractmethod
    def distance(
        dummy: list[torch.Tensor], target: list[torch.Tensor], constants: list[torch.Tensor]
    ) -> torch.Tensor:
        """Scalar distance between a dummy and the observed gradient (one problem)."""

    def distance_constants(
        self, target: list[torch.Tensor], depths: list[int]
    ) -> list[torch.Tensor]:
        """Per-victim constants the distance needs (none by default)."""
        return []

    # -- extension points: each takes the problem, none keeps state ----------------

    def victim_extras(
        self, observation: Observation, labels: torch.Tensor | None, seed: int
    ) -> dict[str, torch.Tensor]:
        """Per-victim constants of :meth:`extra_objective` (none by default).

        ``labels``: the inferred labels ``(B,)`` when labels are inferred.
        """
        return {}

    def simulated_gradient(
        self,
        problem: MatchingProblem,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        functional: bool,
    ) -> list[torch.Tensor]:
        """The attacker's model of the client: what it would upload for batch ``(x, y)``.

        In gradient orientation (``dL/dtheta``) on ``problem.names``, comparable
        with :func:`~fedsim.attacks.gradients.target_gradient`. By default one
        gradient step (exact for FedSGD). ``functional``: compute it with
        ``torch.func`` (required under ``vmap``); otherwise plain autograd may
        be used (cheaper for a lone problem).
        """
        if not functional:
            leaves = {n: p.detach() for n, p in params.items()}
            return batch_gradient(problem.model, leaves, x, y, problem.names)
        shared = {n: params[n] for n in problem.names}
        fixed = {n: p for n, p in params.items() if n not in shared}
        by_name = torch.func.grad(model_loss(problem.model))(shared, fixed, x, y)
        return [by_name[n] for n in problem.names]

    def extra_objective(
        self,
        problem: MatchingProblem,
        params: dict[str, torch.Tensor],
        extras: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> torch.Tensor | None:
        """Terms added to the gradient distance (priors, alignment); ``None`` adds nothing."""
        return None

    def dummy_copies(self, observation: Observation) -> int:
        """Dummy copies of the victim's examples optimised (1; one per epoch for
        ``fedavg-leakage``, whose copies :meth:`merge_copies` joins at the end)."""
        return 1

    def merge_copies(
        self, x: torch.Tensor, label_scores: torch.Tensor, examples: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``examples`` images and label scores reported from the optimised copies."""
        return x, label_scores

    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        """Recover the victim's batch from ``observation`` alone."""
        return self.reconstruct_many([observation], seed)[0]

    def fidelity_residual(
        self, observation: Observation, images: torch.Tensor, labels: torch.Tensor, seed: int = 0
    ) -> float:
        """How well this attack models the client: ``||simulated - observed|| / ||observed||``.

        ``simulated`` is :meth:`simulated_gradient` on the given batch
        (``images`` in pixel space [0, 1], ``labels`` ``(B,)``), ``observed``
        the gradient the attack matches; both over every shared layer. With
        the victim's true batch it is zero (up to float rounding) exactly
        when the attack's model of the client is right; a defence's noise, a
        private extractor the attacker only estimates, or an unknown batch
        order shows up here. The caller holds the truth and passes it in:
        no attack ever receives it through an observation.
        """
        problem = self.build_problem([observation], seed, infer=False)
        params = {k: v[0] for k, v in problem.params.items()}
        x = observation.normalization.to_model(images.to(self.device, torch.float32))
        y = F.one_hot(labels.to(self.device).long(), problem.num_classes).float()
        simulated = self.simulated_gradient(problem, params, x, y, functional=False)
        return relative_residual(simulated, [t[0] for t in problem.target])

    def reconstruct_many(
        self, observations: Sequence[Observation], seed: int = 0
    ) -> list[Reconstruction]:
        """Attack several observations in one batched optimisation.

        Observations with the same architecture, shared layers and batch shape
        run together; restart ``r`` starts from the same dummy whichever call
        it is in, so batching changes speed, not results (up to float
        rounding).
        """
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, obs in enumerate(observations):
            key = (
                obs.model,
                obs.input_spec,
                obs.normalization,
                tuple(obs.shared),
                obs.num_examples,
            )
            groups.setdefault(key, []).append(i)
        results: list[Reconstruction | None] = [None] * len(observations)
        for members in groups.values():
            batch = self._attack_group([observations[i] for i in members], seed)
            for i, rec in zip(members, batch, strict=True):
                results[i] = rec
        return [r for r in results if r is not None]

    def build_problem(
        self, observations: Sequence[Observation], seed: int, infer: bool = True
    ) -> MatchingProblem:
        """The batched problem of ``observations`` (one group of :meth:`reconstruct_many`).

        ``infer=False`` skips label inference (the caller brings labels).
        """
        first = observations[0]
        knowledge = self.params.batchnorm
        model, _ = victim_model(first, self.device, seed)
        names = list(first.shared)
        depths = layer_depths(model, names)
        per_victim_params, targets, constants, labels, extras = [], [], [], [], []
        spec = first.input_spec
        inferring = infer and self.params.labels == "infer"
        for obs in observations:
            _, params = victim_model(obs, self.device, seed)
            target = target_gradient(obs, self.device)
            per_victim_params.append(params)
            targets.append([target[n].float() for n in names])
            constants.append(self.distance_constants(targets[-1], depths))
            found = infer_labels(obs, self.device, self.params.batch_labels) if inferring else None
            if found is not None:
                onehot = F.one_hot(found, spec.num_classes).float()
                labels.append(onehot.repeat(self.dummy_copies(obs), 1))
            if infer:
                believed = batchnorm_targets(obs, model, knowledge)
                prior = {f"{BATCHNORM_PRIOR}{k}": v.to(self.device) for k, v in believed.items()}
                extras.append({**self.victim_extras(obs, found, seed), **prior})

        def stack(items: list[list[torch.Tensor]]) -> list[torch.Tensor]:
            return [torch.stack(column) for column in zip(*items, strict=True)]

        # Clients of one round got the same global model: keep one copy, so the
        # batched forward uses plain convolutions instead of per-row (grouped) ones.
        same = all(torch.equal(p[k], per_victim_params[0][k]) for p in per_victim_params for k in p)
        return MatchingProblem(
            model=model,
            names=names,
            params={
                k: torch.stack([p[k] for p in per_victim_params[: 1 if same else None]])
                for k in per_victim_params[0]
            },
            shared_model=same,
            target=stack(targets),
            constants=stack(constants) if constants[0] else [],
            extras={k: torch.stack([e[k] for e in extras]) for k in extras[0]} if extras else {},
            labels=torch.stack(labels) if labels else None,
            image_shape=(
                first.num_examples * self.dummy_copies(first),
                spec.channels,
                spec.image_size,
                spec.image_size,
            ),
            num_classes=spec.num_classes,
            schedule=LocalSchedule.of(first),
            shared_kind=first.shared_kind,
            batchnorm=batchnorm_view(first, knowledge),
        )

    def problem_objective(self, problem: MatchingProblem, functional: bool) -> Any:
        """``(params, target, constants, extras, x, y) -> objective`` for one victim's row."""

        def objective(params, target, constants, extras, x, y):
            dummy = self.simulated_gradient(problem, params, x, y, functional)
            value = self.distance(dummy, target, constants)
            extra = self.extra_objective(problem, params, extras, x, y)
            value = value if extra is None else value + extra
            believed = {
                k[len(BATCHNORM_PRIOR) :]: v
                for k, v in extras.items()
                if k.startswith(BATCHNORM_PRIOR)
            }
            if believed:
                prior = batchnorm_prior(problem.model, params, x, believed)
                value = value + self.params.batchnorm_weight * prior
            return value

        return objective

    def _objective(self, group: MatchingProblem, restarts: int) -> Any:
        """The batched objective over rows ``(victim, restart)`` for the optimiser."""
        problem = self.problem_objective(group, functional=True)
        lone = self.problem_objective(group, functional=False)
        batch, channels, height, width = group.image_shape
        pixels = batch * channels * height * width
        batched_params = None if group.shared_model else 0

        def objective(z: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            z = z.detach().requires_grad_(True)
            x = z[:, :pixels].reshape(-1, batch, channels, height, width)
            victims = rows // restarts
            if group.labels is None:
                y = z[:, pixels:].reshape(-1, batch, group.num_classes).softmax(dim=-1)
            else:
                y = group.labels[victims]
            target = [t[victims] for t in group.target]
            constants = [c[victims] for c in group.constants]
            extras = {k: v[victims] for k, v in group.extras.items()}
            if group.shared_model:
                params = {k: v[0] for k, v in group.params.items()}
            else:
                params = {k: v[victims] for k, v in group.params.items()}
            if len(rows) == 1:
                # vmap costs more than it saves for a single problem.
                one = params if group.shared_model else {k: v[0] for k, v in params.items()}
                first = {k: v[0] for k, v in extras.items()}
                value = lone(
                    one, [t[0] for t in target], [c[0] for c in constants], first, x[0], y[0]
                )[None]
            else:
                in_dims = (batched_params, 0, 0, 0, 0, 0)
                value = vmap(problem, in_dims=in_dims)(params, target, constants, extras, x, y)
            (grad,) = torch.autograd.grad(value.sum(), z)
            return value.detach(), grad

        return objective

    def _optimizer(
        self, z: torch.Tensor, bounds: tuple[torch.Tensor, torch.Tensor]
    ) -> BatchedOptimizer:
        p = self.params
        inner = bounds if p.clamp == "iteration" else None
        if p.optimizer == "adamw":
            steps = p.step_count
            decay = [steps * k // 8 for k in (3, 5, 7)] if p.step_decay else []
            return BatchedAdamW(
                z,
                inner,
                lr=p.learning_rate,
                weight_decay=p.weight_decay,
                signed=p.signed_gradient,
                milestones=decay,
            )
        return BatchedLBFGS(
            z, inner, lr=p.learning_rate, max_iter=p.lbfgs_iterations, history_size=p.history_size
        )

    def _initial_rows(
        self, observation: Observation, victims: int, seed: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Dummy rows ``(V * R, D)`` and the per-coordinate data range ``(D,)``.

        Restart ``r`` draws from its own stream ``(seed, r)``, so
        every victim's restart ``r`` starts alike whatever else is batched.
        """
        p, spec, norm = self.params, observation.input_spec, observation.normalization
        examples = observation.num_examples * self.dummy_copies(observation)
        shape = (examples, spec.channels, spec.image_size, spec.image_size)
        ones = torch.ones(1, spec.channels, 1, 1)
        low, high = norm.to_model(0 * ones).expand(shape), norm.to_model(ones).expand(shape)
        rows = []
        for r in range(p.restarts):
            gen = torch.Generator().manual_seed(derive_seed(SeedStream.ATTACK_RESTART, seed, r))
            if p.dummy_init == "normal":
                x = torch.randn(shape, generator=gen)
            elif p.dummy_init == "uniform":
                x = low + (high - low) * torch.rand(shape, generator=gen)
            else:
                x = norm.to_model(torch.full(shape, p.dummy_constant))
            logits = torch.randn(shape[0], spec.num_classes, generator=gen)
            parts = [x.flatten()] + ([logits.flatten()] if p.labels == "joint" else [])
            rows.append(torch.cat(parts))
        z = torch.stack(rows).repeat(victims, 1)
        free = torch.full((z.shape[1] - low.numel(),), float("inf"))
        lower = torch.cat([low.flatten(), -free])
        upper = torch.cat([high.flatten(), free])
        return z.to(self.device), lower.to(self.device), upper.to(self.device)

    def _attack_group(self, observations: Sequence[Observation], seed: int) -> list[Reconstruction]:
        start = time.perf_counter()
        p = self.params
        group = self.build_problem(observations, seed)
        victims, restarts = len(observations), p.restarts
        z, lower, upper = self._initial_rows(observations[0], victims, seed)
        if p.clamp != "off":
            z = torch.clamp(z, lower, upper)
        optimizer = self._optimizer(z, (lower, upper))
        objective = self._objective(group, restarts)
        rule, budget = p.convergence, p.step_count
        tracker = ConvergenceTracker(
            len(z), rule.steps_in_window(budget), rule.rtol, z.device, rule.failure_ratio
        )
        trace = []
        for step in range(budget):
            trace.append(optimizer.step(objective))
            tracker.update(trace[-1])
            self.report_progress(step + 1, budget, trace[-1])
            if p.clamp == "step":
                optimizer.project(lower, upper)
            if rule.early_stop:
                stalled = tracker.stalled()
                if optimizer.last_phase:
                    optimizer.stopped |= stalled  # converged rows stop; the rest go on
                elif bool(stalled[optimizer.active].all()):
                    # The rows share one learning rate: once all have stalled in a
                    # phase, they all move on to the next, smaller one.
                    optimizer.next_phase()
                    tracker.restart_window()
                if not bool(optimizer.active.any()):
                    break
        optimizer.evaluate(objective, ~optimizer.diverged)  # the distance where each row ended
        diverged = optimizer.diverged | tracker.diverged(optimizer.loss)
        converged_rows, reasons = tracker.outcome(diverged)
        converged = converged_rows.view(victims, -1)
        final = torch.where(optimizer.diverged, float("inf"), optimizer.loss).view(victims, -1)
        # Diverged restarts are passed over; a victim whose every restart diverged keeps
        # the lowest finite one (flagged: not converged, every restart counted diverged).
        rank = torch.where(diverged.view(victims, -1), float("inf"), final)
        rank = torch.where(torch.isinf(rank).all(dim=1, keepdim=True), final, rank)
        trace_rows = torch.stack(trace, dim=1).view(victims, restarts, -1)
        seconds = (time.perf_counter() - start) / victims
        results = []
        for v, obs in enumerate(observations):
            best = int(torch.argmin(rank[v]))  # argmin of all-inf picks restart 0
            row = v * restarts + best
            results.append(
                self._reconstruction(
                    obs,
                    optimizer.z[row],
                    group,
                    None if group.labels is None else group.labels[v],
                    objective_trace=trace_rows[v, best].tolist(),
                    final_objective=float(final[v, best]),
                    seconds=seconds,
                    steps_taken=tracker.steps,
                    converged=bool(converged[v, best]),
                    details={
                        "restart_objectives": final[v].tolist(),
                        "chosen_restart": best,
                        "diverged_restarts": int(diverged.view(victims, -1)[v].sum()),
                        "converged_restarts": int(converged[v].sum()),
                        "stop_reason": reasons[row],
                        "evaluations": optimizer.evaluations.view(victims, -1)[v].tolist(),
                        "labels": "joint"
                        if group.labels is None
                        else label_method(obs, p.batch_labels),
                        "batchnorm": group.batchnorm,
                        "batched_problems": victims * restarts,
                    },
                )
            )
        return results

    def _reconstruction(
        self,
        observation: Observation,
        row: torch.Tensor,
        group: MatchingProblem,
        fixed_labels: torch.Tensor | None,  # one-hot (B, K) when labels are inferred
        **fields: Any,
    ) -> Reconstruction:
        batch, channels, height, width = group.image_shape
        pixels = batch * channels * height * width
        x = row[:pixels].detach().reshape(batch, channels, height, width)
        if fixed_labels is None:
            scores = row[pixels:].detach().reshape(batch, group.num_classes)
        else:
            scores = fixed_labels
        x, scores = self.merge_copies(x, scores, observation.num_examples)
        x, labels = x.cpu(), scores.argmax(dim=-1).cpu()
        images = observation.normalization.to_pixels(x).clamp(0, 1)
        return Reconstruction(
            images=images,
            labels=labels,
            iterations=self.params.step_count,
            restarts=self.params.restarts,
            **fields,
        )


BATCHNORM_PRIOR = "batchnorm-prior:"
"""Prefix of the believed BatchNorm statistics among a problem's per-victim extras."""


def batchnorm_prior(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    believed: dict[str, torch.Tensor],
) -> torch.Tensor:
    """``sum_l ||mu_l(x) - mu_l|| + ||var_l(x) - var_l||`` over BatchNorm inputs (biased var).

    ``believed`` is keyed like :func:`fedsim.core.models.batch_statistics`.
    """
    with recording_batch_statistics(model) as found:
        functional_call(model, params, (x,))
    return torch.stack([(found[k] - v).norm() for k, v in believed.items()]).sum()


def require_replayable(observation: Observation, attack: str) -> None:
    """Refuse an observation whose local training :func:`replay_local_training` cannot replay."""
    if not observation.is_update:
        raise ValueError(f"{attack} replays updates; this observation holds gradients")
    if observation.summed_examples:
        raise ValueError(
            f"{attack} replays one client's update; this observation sums "
            f"{len(observation.summed_examples)} clients'"
        )
    refusal = replay_refusal(observation.train_config)
    if refusal is not None:
        raise ValueError(f"{attack} replays the client's local training; {refusal}")


def replay_local_training(
    problem: MatchingProblem,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    adam_smoothing: float = 0.0,
) -> list[torch.Tensor]:
    """``(w_global - w_K) / (lr K)`` after replaying the client's ``K`` local steps.

    The client's optimiser, weight decay and FedProx's proximal term are
    replayed (:mod:`fedsim.attacks.replay`). The client's batch order is
    private: dummy slots ``[start, stop)`` of an epoch form its step. ``x``
    holds one set of the client's examples (every epoch reuses its slots, as
    if the client never reshuffled) or one per epoch (``len(x)`` a multiple
    of the examples: each epoch its own dummies, tied by an attack's prior).
    ``adam_smoothing``: see :func:`~fedsim.attacks.replay.replay`. Differentiable
    in ``x`` and ``y`` with ``torch.func`` (works under ``vmap``).
    """
    names, schedule = problem.names, problem.schedule
    per_epoch = len(x) > schedule.num_examples
    start = {n: params[n] for n in names}
    fixed = {n: p for n, p in params.items() if n not in start}
    loss_grad = torch.func.grad(model_loss(problem.model))

    def grad(weights: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor):
        return loss_grad(weights, fixed, xb, yb)

    batches = []
    for b in schedule.batches:
        offset = b.epoch * schedule.num_examples if per_epoch else 0
        batches.append(
            (x[offset + b.start : offset + b.stop], y[offset + b.start : offset + b.stop])
        )
    weights = replay(schedule.client, grad, start, batches, schedule.proximal_mu, adam_smoothing)
    return [(start[n] - weights[n]) / (schedule.lr * schedule.steps) for n in names]


def model_loss(model: nn.Module) -> Any:
    """``(shared, fixed, x, y) -> loss``: the mean (soft-label) cross-entropy of ``model``."""

    def loss(shared, fixed, x, y):
        return soft_cross_entropy(functional_call(model, {**fixed, **shared}, (x,)), y)

    return loss
