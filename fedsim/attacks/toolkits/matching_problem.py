"""What a gradient-matching attack solves: its problem, and the client's training replayed.

A :class:`MatchingProblem` holds the observations attacked together and the
:class:`LocalSchedule` the attacker believes the client ran;
:func:`replay_local_training` replays that schedule differentiably
(:mod:`fedsim.attacks.toolkits.replay`) for the attacks that match whole updates
(``unrolled-dlg``, ``fedavg-leakage``, Inverting Gradients on updates).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fedsim.attacks.base import Observation
from fedsim.attacks.toolkits.gradients import (
    local_steps_taken,
    soft_cross_entropy,
)
from fedsim.attacks.toolkits.replay import Batch, local_batches, replay, replay_refusal
from fedsim.core.config import ClientConfig
from fedsim.core.models import SplitNet, recording_batch_statistics


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
    replayed (:mod:`fedsim.attacks.toolkits.replay`). The client's batch order is
    private: dummy slots ``[start, stop)`` of an epoch form its step. ``x``
    holds one set of the client's examples (every epoch reuses its slots, as
    if the client never reshuffled) or one per epoch (``len(x)`` a multiple
    of the examples: each epoch its own dummies, tied by an attack's prior).
    ``adam_smoothing``: see :func:`~fedsim.attacks.toolkits.replay.replay`. Differentiable
    in ``x`` and ``y`` with ``torch.func`` (works under ``vmap``).
    """
    return replay_update(
        problem.model, problem.names, problem.schedule, params, x, y, adam_smoothing
    )


def replay_update(
    model: nn.Module,
    names: Sequence[str],
    schedule: LocalSchedule,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    adam_smoothing: float = 0.0,
) -> list[torch.Tensor]:
    """:func:`replay_local_training` without a :class:`MatchingProblem` (a residual's lone
    replay): ``model``, its shared parameters' ``names`` and the client's ``schedule``."""
    per_epoch = len(x) > schedule.num_examples
    start = {n: params[n] for n in names}
    fixed = {n: p for n, p in params.items() if n not in start}
    loss_grad = torch.func.grad(model_loss(model))

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
