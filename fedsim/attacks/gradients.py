"""Shared machinery for optimisation attacks: the victim model, the target
gradient recovered from an observation, and differentiable dummy gradients.

Everything here reads only an :class:`~fedsim.attacks.base.Observation`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedsim.attacks.base import Observation
from fedsim.core.models import SplitNet, build_model
from fedsim.core.seeds import SeedStream, derive_seed


def victim_model(
    observation: Observation, device: torch.device, seed: int = 0
) -> tuple[SplitNet, dict[str, torch.Tensor]]:
    """The architecture at the global parameters the server sent.

    Parameters the server never saw (a FedSplit extractor) keep a random
    initialisation from ``seed``: the attacker's estimate E~.
    """
    model_seed = derive_seed(SeedStream.ATTACK_MODEL, seed)
    model = build_model(observation.model, observation.input_spec, seed=model_seed).to(device)
    model.eval()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    for name, value in observation.global_params.items():
        if name in params:
            params[name] = value.detach().to(device=device, dtype=params[name].dtype).clone()
    return model, params


def target_gradient(observation: Observation, device: torch.device) -> dict[str, torch.Tensor]:
    """The gradient the attack matches, in ``dL/dtheta`` orientation.

    A ``gradient`` observation is used as is. An ``update`` observation holds
    the client's new parameters: one SGD step gives ``(w_global - w_client)/lr``
    exactly; several steps give that sum of gradients divided by the number of
    steps, i.e. the update read as one large-batch step (an approximation).
    """
    if observation.shared_kind == "gradient":
        return {k: v.detach().to(device) for k, v in observation.shared.items()}
    cfg = observation.train_config
    steps = max(1, local_steps_taken(observation))
    return {
        name: (observation.global_params[name].to(device) - value.to(device)) / (cfg.lr * steps)
        for name, value in observation.shared.items()
    }


def local_steps_taken(observation: Observation) -> int:
    """How many optimiser steps the client took, from the public config."""
    cfg = observation.train_config
    if cfg.local_steps:
        return cfg.local_steps
    batches = -(-observation.num_examples // cfg.batch_size)
    return cfg.local_epochs * batches


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy for hard (long) or soft (probability rows) targets."""
    if targets.dtype == torch.long:
        return F.cross_entropy(logits, targets)
    return -(targets * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def batch_gradient(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    images: torch.Tensor,
    targets: torch.Tensor,
    names: list[str],
    create_graph: bool = True,
) -> list[torch.Tensor]:
    """Gradient of the mean CE loss on ``(images, targets)`` w.r.t. ``names``.

    ``create_graph=True`` keeps it differentiable in ``images`` and
    ``targets`` (what gradient matching needs).
    """
    leaves = {n: (p.requires_grad_(True) if n in names else p) for n, p in params.items()}
    logits = functional_call(model, leaves, (images,))
    loss = soft_cross_entropy(logits, targets)
    return list(torch.autograd.grad(loss, [leaves[n] for n in names], create_graph=create_graph))
