"""The gradient probe: what the server would see for one real batch.

Engine-side code (it touches ground truth). :func:`gradient_probe` computes
the gradient of one batch at the current model and wraps it in an
:class:`~fedsim.attacks.base.Observation`; the batch itself goes into a separate
:class:`GroundTruth` that only the scorer reads. The privacy audit and
``fedsim attack`` both build their probes here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.attacks.base import Observation, SharedKind
from fedsim.core.config import ClientConfig, ModelConfig
from fedsim.core.data import Normalization
from fedsim.core.models import InputSpec


@dataclass(frozen=True)
class GroundTruth:
    """The victim's batch: images in pixel space [0, 1] and labels. Scorer only."""

    images: torch.Tensor
    labels: torch.Tensor


@dataclass(frozen=True)
class Probe:
    """An observation for the attack and, kept apart, the truth for the scorer."""

    observation: Observation
    truth: GroundTruth


def gradient_probe(
    model: nn.Module,
    model_config: ModelConfig,
    input_spec: InputSpec,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    normalization: Normalization,
    *,
    shared_names: Sequence[str] | None = None,
    shared_kind: SharedKind = "gradient",
    train_config: ClientConfig | None = None,
    round: int = 0,
    client_id: int = 0,
    strategy: str = "fedavg",
) -> Probe:
    """Observe the gradient of ``(inputs, labels)`` at ``model``'s current weights.

    Parameters
    ----------
    model:
        The global model the server sent (left unchanged; evaluated in eval
        mode, as the attacker's copy is).
    inputs:
        One batch in model-input space (as a :class:`~fedsim.core.data.DatasetBundle` holds it).
    shared_names:
        Parameters the server receives (default: all of them).
    shared_kind:
        ``gradient`` shares ``dL/dtheta``; ``update`` shares the parameters
        after one SGD step of ``train_config.lr`` on this batch (FedSGD), so
        the observation's config says one local step on a batch of this size.
    """
    params = dict(model.named_parameters())
    names = list(shared_names) if shared_names is not None else list(params)
    was_training = model.training
    model.eval()
    try:
        loss = F.cross_entropy(model(inputs), labels)
        grads = torch.autograd.grad(loss, [params[n] for n in names])
    finally:
        model.train(was_training)
    gradient = {n: g.detach().cpu() for n, g in zip(names, grads, strict=True)}
    global_params = {n: p.detach().cpu().clone() for n, p in params.items()}
    config = dataclasses.replace(
        train_config or ClientConfig(), local_steps=1, batch_size=len(inputs)
    )
    shared = gradient
    if shared_kind == "update":
        shared = {n: global_params[n] - config.lr * g for n, g in gradient.items()}
    observation = Observation(
        round=round,
        client_id=client_id,
        threat_model="probe",
        shared_kind=shared_kind,
        shared=shared,
        global_params=global_params,
        model=model_config,
        input_spec=input_spec,
        normalization=normalization,
        train_config=config,
        num_examples=len(inputs),
        strategy=strategy,
    )
    truth = GroundTruth(normalization.to_pixels(inputs.detach().cpu()).clamp(0, 1), labels.cpu())
    return Probe(observation, truth)
