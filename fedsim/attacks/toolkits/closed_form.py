"""What the closed-form attacks share: the exact gradient of a FedSGD upload, a model's
layers and the input one of them receives, and images inverted to given features.

An upload is a gradient exactly when it is a probe or one local step of plain SGD
(:func:`exact_gradient` refuses the rest in one line); :func:`layer_input` runs the forward
pass only up to a layer; :func:`invert_features` finds images whose input to a layer is
given (``analytic-fc`` on conv nets), and :class:`Inversion` a representatives leak's images
from its features (``class-representatives``, ``generator-representatives``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.leakage import RepresentativesLeak
from fedsim.attacks.toolkits.gradients import (
    batch_gradient,
    local_steps_taken,
    relative_residual,
    target_gradient,
    victim_model,
)
from fedsim.attacks.toolkits.matching_problem import LocalSchedule, replay_update
from fedsim.attacks.toolkits.optim import BatchedAdamW
from fedsim.core.config import ClientConfig, require
from fedsim.core.models import InputSpec, SplitNet, build_model

INVERTED = 1e-4
"""A feature inversion whose relative error ``||E(x) - f||^2 / ||f||^2`` is at most this
has converged (measured: 1e-8..1e-7 on LeNet-5 and LeNet-Zhu, 5e-3 where it stalled)."""

ADAM_NOTE = "an Adam or momentum step carries little more than the gradient's signs"


def plain_sgd(cfg: ClientConfig) -> bool:
    """Whether a local step is ``w - lr * g`` (no momentum, no weight decay)."""
    return cfg.optimizer == "sgd" and not cfg.momentum and not cfg.weight_decay


def setting_batch(setting: AttackSetting, attack: str, key: str) -> int | None:
    """The batch each audited gradient holds, refusing audits that give no exact gradient.

    ``None`` when the scenario runs no audit (``fedsim attack`` probes one
    batch of its own and checks it per observation).
    """
    client = setting.client
    if not setting.audited:
        return None
    if setting.threat_model.counterfactual:  # a probe: one batch's gradient
        return setting.probe_batch_size
    require(
        plain_sgd(client),
        f"{key}.name",
        attack,
        f"reads one plain SGD step; client.optimizer = {client.optimizer!r}, "
        f"momentum {client.momentum}, weight-decay {client.weight_decay} ({ADAM_NOTE})",
    )
    samples = setting.data.samples_per_client
    one_epoch_step = client.local_epochs == 1 and 0 < samples <= client.batch_size
    require(
        client.local_steps == 1 or (client.local_steps == 0 and one_epoch_step),
        f"{key}.name",
        attack,
        "reads one local step (FedSGD: client.local-steps = 1); several steps "
        "sum gradients at different weights",
    )
    return client.batch_size if client.local_steps == 1 else min(samples, client.batch_size)


def exact_gradient(observation: Observation, attack: str) -> dict[str, torch.Tensor]:
    """The observation's gradient ``dL/dtheta``, refusing uploads that do not give it exactly.

    Raises
    ------
    ValueError
        For several local steps or a step other than plain SGD.
    """
    if observation.is_update:
        cfg, steps = observation.train_config, local_steps_taken(observation)
        if steps != 1:
            raise ValueError(
                f"{attack} reads one local SGD step (FedSGD); this update took {steps}"
            )
        if not plain_sgd(cfg):
            raise ValueError(
                f"{attack} reads one plain SGD step; the client used optimizer={cfg.optimizer!r}, "
                f"momentum={cfg.momentum}, weight-decay={cfg.weight_decay} ({ADAM_NOTE})"
            )
    return target_gradient(observation, torch.device("cpu"))


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The model's linear layers by module name, in registration (here: forward) order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules without children by name, in registration (here: forward) order."""
    return [(n, m) for n, m in model.named_modules() if not list(m.children())]


def reads_image(model: nn.Module, layer: str) -> bool:
    """Whether module ``layer``'s input is the flattened image (only flattens before it)."""
    names = [n for n, _ in leaf_modules(model)]
    before = leaf_modules(model)[: names.index(layer)]
    return all(isinstance(m, nn.Flatten) for _, m in before)


def setting_model(setting: AttackSetting) -> SplitNet:
    """The setting's architecture on the ``meta`` device (structure only, no memory)."""
    spec = InputSpec(3 if setting.data.channels == "rgb" else 1, setting.data.image_size, 10)
    with torch.device("meta"):
        return build_model(setting.model, spec)


def uploaded(name: str, uploads: tuple[str, ...] | None) -> bool:
    """Whether parameter ``name`` reaches the server (``uploads``: prefixes, ``None``: all)."""
    return uploads is None or name.startswith(uploads)


class _LayerInput(Exception):
    """Raised by a hook to stop a forward pass once a layer's input is known."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__("layer input captured")
        self.value = value


@contextmanager
def stopping_at(layer: nn.Module) -> Iterator[None]:
    """While open, a forward pass raises :class:`_LayerInput` on reaching ``layer``."""

    def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        raise _LayerInput(args[0])

    handle = layer.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def layer_input(
    model: SplitNet, params: dict[str, torch.Tensor], layer: nn.Module, x: torch.Tensor
) -> torch.Tensor:
    """What ``layer`` receives when ``x`` enters the model (flattened per example)."""
    with stopping_at(layer):
        try:
            functional_call(model, params, (x,))
        except _LayerInput as found:
            return found.value.flatten(1)
    raise ValueError("the layer is not on the model's forward path")


def one_step_residual(
    observation: Observation,
    images: torch.Tensor,
    labels: torch.Tensor,
    seed: int,
    device: torch.device,
) -> float:
    """``||g(images, labels) - g|| / ||g||`` over every shared tensor: one gradient step
    of the attacker's model (sent weights, private ones estimated from ``seed``)
    on a batch in pixel space against the intercepted gradient; ``replayed_residual``:
    the client's whole local training replayed instead."""
    return _residual(observation, (images, labels), seed, device, replayed=False)


def replayed_residual(
    observation: Observation, batch: tuple[torch.Tensor, torch.Tensor], seed: int
) -> float:
    """As :func:`one_step_residual` of ``batch`` (images, labels), the client's local
    training replayed from the public config instead
    (:func:`~fedsim.attacks.toolkits.matching_problem.replay_update`: its optimiser from a
    fresh state, the batch in slot order every epoch), read as ``(w_global - w_K) / (lr K)``,
    the intercepted update's orientation; on the CPU."""
    return _residual(observation, batch, seed, torch.device("cpu"), replayed=True)


def _residual(
    observation: Observation,
    batch: tuple[torch.Tensor, torch.Tensor],
    seed: int,
    device: torch.device,
    replayed: bool,
) -> float:
    model, params = victim_model(observation, device, seed)
    target = target_gradient(observation, device)
    names = list(observation.shared)
    x = observation.normalization.to_model(batch[0].to(device, torch.float32))
    y = F.one_hot(batch[1].to(device).long(), observation.input_spec.num_classes).float()
    if replayed:
        with torch.no_grad():
            simulated = replay_update(model, names, LocalSchedule.of(observation), params, x, y)
    else:
        simulated = batch_gradient(model, params, x, y, names, create_graph=False)
    return relative_residual(simulated, [target[n] for n in names])


def invert_features(
    model: SplitNet,
    params: dict[str, torch.Tensor],
    layer: nn.Module,
    features: torch.Tensor,
    observation: Observation,
    steps: int,
    lr: float,
    progress: Callable[[int, int, torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``x`` (model-input space) with ``layer_input(x) = features`` row by row,
    ``features`` ``(m, D)``, and each row's final relative feature error
    ``||E(x) - f||^2 / ||f||^2`` (``(m,)``; nan without steps).

    Adam from a grey image in pixel space, boxed to [0, 1] (so the learning rate
    means the same with or without normalisation), all rows in one batch; grey
    images when ``steps`` is 0.
    """
    spec, norm = observation.input_spec, observation.normalization
    shape = (spec.channels, spec.image_size, spec.image_size)
    rows = len(features)
    device = features.device
    grey = torch.full((rows, shape[0] * shape[1] * shape[2]), 0.5, device=device)
    if steps == 0:
        return norm.to_model(grey.reshape(rows, *shape)), torch.full((rows,), float("nan"))
    scale = features.square().sum(dim=1).clamp_min(1e-30)
    fixed = {n: p.detach() for n, p in params.items()}

    def objective(z: torch.Tensor, live: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = z.detach().requires_grad_(True)
        x = norm.to_model(z.reshape(-1, *shape))
        error = layer_input(model, fixed, layer, x) - features[live]  # rows still optimised
        value = error.square().sum(dim=1) / scale[live]
        (grad,) = torch.autograd.grad(value.sum(), z)
        return value.detach(), grad

    box = (torch.zeros(grey.shape[1], device=device), torch.ones(grey.shape[1], device=device))
    optimizer = BatchedAdamW(grey, box, lr=lr, weight_decay=0.0)
    for step in range(steps):
        optimizer.step(objective)
        if progress is not None:
            progress(step + 1, steps, optimizer.loss)
    optimizer.evaluate(objective, torch.ones(rows, dtype=torch.bool, device=device))
    return norm.to_model(optimizer.z.reshape(rows, *shape)), optimizer.loss.detach().cpu()


@dataclass(frozen=True)
class Inversion:
    """Features inverted to images through ``layer``'s input in ``model`` at ``params``
    (:func:`invert_features`; ``steps`` 0: no images)."""

    model: SplitNet
    params: dict[str, torch.Tensor]
    layer: nn.Module
    steps: int
    lr: float

    def leak(
        self,
        observation: Observation,
        classes: torch.Tensor,
        features: torch.Tensor,
        started: float,
        details: dict[str, Any],
    ) -> RepresentativesLeak:
        """The representatives of ``classes`` (one row of ``features`` each), inverted
        where there are steps; ``started``: the analysis's ``perf_counter`` start."""
        images, converged = None, True
        if self.steps and len(classes):
            x, residuals = invert_features(
                self.model, self.params, self.layer, features, observation, self.steps, self.lr
            )
            images = observation.normalization.to_pixels(x.detach().cpu()).clamp(0, 1)
            converged = bool((residuals <= INVERTED).all())
            details["feature_residual"] = residuals.tolist()
        return RepresentativesLeak(
            classes.cpu(),
            images,
            features.cpu(),
            converged,
            time.perf_counter() - started,
            details,
        )
