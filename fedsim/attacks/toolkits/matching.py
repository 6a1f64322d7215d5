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
a :mod:`fedsim.attacks.toolkits.optim` optimiser, and one ``torch.func.vmap`` call
evaluates all live rows. Each victim keeps the restart with the lowest final
gradient distance, which the attacker can compute (never the best PSNR, which
it cannot).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch.func import vmap

from fedsim.attacks.base import Attack, Observation, Reconstruction
from fedsim.attacks.toolkits.convergence import ConvergenceTracker
from fedsim.attacks.toolkits.gradients import (
    batch_gradient,
    batchnorm_targets,
    batchnorm_view,
    relative_residual,
    target_gradient,
    victim_model,
)
from fedsim.attacks.toolkits.labels import infer_labels, label_method
from fedsim.attacks.toolkits.matching_problem import (
    BATCHNORM_PRIOR,
    LocalSchedule,
    MatchingProblem,
    batchnorm_prior,
    layer_depths,
    model_loss,
)
from fedsim.attacks.toolkits.optim import BatchedAdamW, BatchedLBFGS, BatchedOptimizer
from fedsim.core.params.matching import MatchingParams
from fedsim.core.seeds import SeedStream, derive_seed


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
        with :func:`~fedsim.attacks.toolkits.gradients.target_gradient`. By default one
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
