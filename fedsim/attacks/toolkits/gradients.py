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
from fedsim.core.models import SplitNet, batchnorm_counts, batchnorm_layers, build_model
from fedsim.core.params.matching import BatchNormKnowledge
from fedsim.core.seeds import SeedStream, derive_seed
from fedsim.core.threat import SharedKind


def victim_model(
    observation: Observation, device: torch.device, seed: int = 0
) -> tuple[SplitNet, dict[str, torch.Tensor]]:
    """The architecture at the global parameters the server sent.

    Parameters the server never saw (a FedSplit extractor) keep a random
    initialisation from ``seed``: the attacker's estimate E~. BatchNorm
    layers use the batch's statistics against an update (the client trained
    in train mode) and the sent running buffers, included in the returned
    tensors, against a probe gradient (computed in eval mode).
    """
    model_seed = derive_seed(SeedStream.ATTACK_MODEL, seed)
    model = build_model(observation.model, observation.input_spec, seed=model_seed).to(device)
    model.eval()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    for name, value in observation.global_params.items():
        if name in params:
            params[name] = value.detach().to(device=device, dtype=params[name].dtype).clone()
    if not batchnorm_layers(model):
        return model, params
    if observation.shared_kind == SharedKind.UPDATE:
        # Running buffers dropped: every BatchNorm layer uses its batch's statistics.
        torch.func.replace_all_batch_norm_modules_(model)
        return model, params
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    buffers.update(_sent_buffers(observation, buffers))
    params.update({n: b.to(device) for n, b in buffers.items()})
    return model, params


def batchnorm_targets(
    observation: Observation, model: SplitNet, batchnorm: BatchNormKnowledge
) -> dict[str, torch.Tensor]:
    """The statistics the attacker believes the victim's batch had (empty when it has none)."""
    view = batchnorm_view(observation, batchnorm)
    if view == "uploaded-buffers":
        return statistics_from_buffers(observation, model)
    if view == "known-batch":
        assert observation.batch_statistics is not None  # batchnorm_view checked
        return dict(observation.batch_statistics)
    return {}


def _sent_buffers(
    observation: Observation, buffers: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    sent = observation.extra_sent
    return {n: v.to(buffers[n].dtype) for n, v in sent.items() if n in buffers}


def has_batchnorm(observation: Observation) -> bool:
    """Whether the victim's architecture has BatchNorm layers."""
    model = build_model(observation.model, observation.input_spec)
    return bool(batchnorm_layers(model))


def batchnorm_view(observation: Observation, batchnorm: BatchNormKnowledge) -> str:
    """How the attacker's model normalises, as recorded in the audit.

    ``no-batchnorm``, ``sent-running`` (a probe: eval mode with the sent
    buffers), ``batch-of-dummy``, ``uploaded-buffers`` or ``known-batch``.

    Raises
    ------
    ValueError
        When the knowledge asked for is not in the observation.
    """
    if not has_batchnorm(observation):
        return "no-batchnorm"
    if observation.shared_kind == SharedKind.GRADIENT:
        return "sent-running"
    if batchnorm == "known":
        if observation.batch_statistics is None:
            raise ValueError(
                'batchnorm = "known" needs the victim batch\'s statistics in the observation '
                "(batch_statistics); this one has none"
            )
        return "known-batch"
    if batchnorm == "buffers":
        if not any(n.endswith(".running_mean") for n in observation.extra_uploads):
            raise ValueError(
                'batchnorm = "buffers" needs the running buffers in the upload; strategy '
                f"{observation.strategy!r} did not upload any (allowed here: none, known)"
            )
        return "uploaded-buffers"
    return "batch-of-dummy"


def statistics_from_buffers(observation: Observation, model: SplitNet) -> dict[str, torch.Tensor]:
    """The batch statistics the uploaded running buffers imply (see :data:`BatchNormKnowledge`).

    After ``K`` steps with momentum ``m``, ``running = (1-m)^K sent + (1 - (1-m)^K) mean``
    when every step's batch has the same mean; the variance buffer holds the
    unbiased variance, turned back into the biased one the forward used.
    """
    uploads, sent = observation.extra_uploads, observation.extra_sent
    steps = max(1, local_steps_taken(observation))
    batch = min(observation.num_examples, observation.train_config.batch_size)
    spec = observation.input_spec
    counts = batchnorm_counts(model, (batch, spec.channels, spec.image_size, spec.image_size))
    found = {}
    for name, layer in batchnorm_layers(model).items():
        momentum = layer.momentum if layer.momentum is not None else 0.1
        kept = (1 - momentum) ** steps
        for buffer in ("running_mean", "running_var"):
            key = f"{name}.{buffer}"
            new, old = uploads[key].double(), sent[key].double()
            value = (new - kept * old) / (1 - kept)
            if buffer == "running_var":
                value = value * (counts[name] - 1) / counts[name]
            found[key] = value.float()
    return found


def target_gradient(observation: Observation, device: torch.device) -> dict[str, torch.Tensor]:
    """The gradient the attack matches, in ``dL/dtheta`` orientation.

    A ``gradient`` observation is used as is. An ``update`` observation holds
    the client's new parameters: one SGD step gives ``(w_global - w_client)/lr``
    exactly; several steps give that sum of gradients divided by the number of
    steps, i.e. the update read as one large-batch step (an approximation).
    """
    if observation.shared_kind == SharedKind.GRADIENT:
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
    # An aggregate: its largest client's steps (all of them one step makes it one gradient).
    sizes = observation.summed_examples or (observation.num_examples,)
    return cfg.local_epochs * max(-(-n // cfg.batch_size) for n in sizes)


def relative_residual(simulated: list[torch.Tensor], observed: list[torch.Tensor]) -> float:
    """``||simulated - observed|| / ||observed||`` over tensor lists (inf if ``observed`` is 0)."""
    difference = sum(
        float((s.detach() - o).square().sum()) for s, o in zip(simulated, observed, strict=True)
    )
    scale = sum(float(o.square().sum()) for o in observed)
    return (difference / scale) ** 0.5 if scale > 0 else float("inf")


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
