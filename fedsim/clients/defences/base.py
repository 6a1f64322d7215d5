"""The client-side defence's type, its registry and what several defences share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from fedsim.clients.base import ClientEnv, ClientSpec
from fedsim.core.params.defences import DEFENCE_PARAMS
from fedsim.core.registry import Registry
from fedsim.core.training import TrainingHook

Tensors = dict[str, torch.Tensor]


class AccountedTraining(TrainingHook, Protocol):
    """A training hook that spends privacy budget: what it spent so far, and its state kept
    across rounds (``dp-sgd``'s :class:`~fedsim.clients.defences.dp_sgd.DPTraining`)."""

    def epsilon(self) -> float: ...

    def save(self) -> None: ...


def global_norm(tensors: Tensors) -> float:
    """L2 norm of all ``tensors`` taken as one vector."""
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors.values()))


def clip_to_norm(tensors: Tensors, max_norm: float) -> Tensors:
    """``tensors`` scaled down so that their global L2 norm is at most ``max_norm``."""
    norm = global_norm(tensors)
    if norm <= max_norm:
        return tensors
    factor = max_norm / norm
    return {k: t * factor for k, t in tensors.items()}


@dataclass(frozen=True)
class ProbeContext:
    """What a probed client holds besides its gradient: the model at the weights the server
    sent and the probed batch's inputs (model-input space). Only ``soteria`` reads it."""

    model: nn.Module
    inputs: torch.Tensor


def noise_like(draw: Any, like: torch.Tensor, width: float) -> torch.Tensor:
    return torch.from_numpy(draw(0.0, width, size=tuple(like.shape))).to(like.dtype)


class Defence:
    """A client-side defence: a frozen ``Params`` dataclass plus hooks.

    :meth:`protect` post-processes the update a client uploads;
    :meth:`protect_gradient` the gradient a probed client shares;
    :meth:`training` may change local training (DP-SGD). A defence with ``probe_only``
    acts only on a probed gradient, so validation refuses it under other threat models
    (:func:`fedsim.scenario.applicability.check_defence_threat`).
    """

    Params: ClassVar[type]
    probe_only: ClassVar[bool] = False

    def __init__(self, params: Any) -> None:
        self.params = params

    def check(self, client: ClientSpec, strategy: str, key: str) -> None:
        """Reject clients (of ``strategy``) this defence cannot protect (runs before Ray starts)."""

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        """The update as uploaded."""
        return update

    def protect_gradient(
        self,
        gradient: Tensors,
        batch_size: int,
        rng: np.random.Generator,
        context: ProbeContext | None = None,
    ) -> Tensors:
        """A shared batch gradient as uploaded; by default what :meth:`protect` does.
        ``context`` (the probed batch and model) is for defences that need it."""
        return self.protect(gradient, rng)

    def training(self, env: ClientEnv, server_round: int) -> AccountedTraining | None:
        """A hook for :func:`fedsim.core.training.train_local`, or ``None``."""
        return None


DEFENCES: Registry[Any] = Registry(
    "defence",
    group="fedsim.defences",
    subclass_of=Defence,
    needs=("Params",),
    params=DEFENCE_PARAMS,
)
