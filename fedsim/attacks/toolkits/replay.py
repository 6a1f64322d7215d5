"""The client's local training, replayed differentiably from the public config.

An attacker against a multi-step update simulates what the client did: the
same number of optimiser steps, with the same batch sizes, learning rate,
optimiser (SGD, SGD with momentum and weight decay, Adam, AdamW) and FedProx
proximal term, starting from the global model and a fresh optimiser state,
as :func:`fedsim.core.training.train_local` does. Every step is written with
``torch.func`` so that the final weights are differentiable in the dummy
batch (also under ``vmap``).

Threat model. The server sent the optimiser, lr, momentum, weight decay,
local epochs or steps, batch size and FedProx's mu (the client config is
public, :class:`~fedsim.core.config.ClientConfig`); it knows the number of
examples from the reply. It does not know the client's shuffling seed (a
federation stream, :mod:`fedsim.core.seeds`), so it cannot know which example
went into which batch: the replay takes the dummy images of each epoch in
slot order, and the attack learns each image into whichever slot fits
(order-free). A kept optimiser state (``optimizer-state = "kept"``) is
private and unknown: it is refused where the optimiser has state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedsim.attacks.base import AttackSetting
from fedsim.core.config import ClientConfig, require
from fedsim.core.threat import ThreatModel

Weights = dict[str, torch.Tensor]
GradFn = Callable[[Weights, torch.Tensor, torch.Tensor], Weights]
"""``(weights, x, y) -> dL/dweights`` for one minibatch."""

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam / AdamW defaults: what make_optimizer builds
ADAM_EPS = 1e-8


@dataclass(frozen=True)
class Batch:
    """One local step's minibatch: examples ``[start, stop)`` of epoch ``epoch``'s order."""

    epoch: int
    start: int
    stop: int


def local_batches(num_examples: int, cfg: ClientConfig) -> list[Batch]:
    """The shape of :func:`fedsim.core.training.batch_indices`'s schedule (not its order)."""
    out: list[Batch] = []
    epoch = 0
    while True:
        for start in range(0, num_examples, cfg.batch_size):
            if cfg.local_steps and len(out) == cfg.local_steps:
                return out
            out.append(Batch(epoch, start, min(start + cfg.batch_size, num_examples)))
        epoch += 1
        if not cfg.local_steps and epoch == cfg.local_epochs:
            return out


def stateful(cfg: ClientConfig) -> bool:
    """Whether the client's optimiser carries state from step to step."""
    return cfg.optimizer != "sgd" or cfg.momentum > 0


def replay_refusal(cfg: ClientConfig) -> str | None:
    """Why the client's local training cannot be replayed, or ``None`` when it can."""
    if cfg.optimizer_state == "kept" and stateful(cfg):
        return (
            f"the clients keep their {cfg.optimizer} state across rounds "
            '(optimizer-state = "kept"): the server cannot know it'
        )
    if cfg.augment != "none":
        return f"the clients augment their batches at random (augment = {cfg.augment!r})"
    return None


def check_replayable_setting(setting: AttackSetting, key: str, attack: str) -> None:
    """Refuse, for ``attack``, local training :func:`replay_refusal` refuses (one client's
    own update, which it replays, is its declared threat model: ``ONE_UPDATE``)."""
    refusal = replay_refusal(setting.client)
    require(refusal is None, f"{key}.name", attack, f"cannot replay: {refusal}")


def replay(
    cfg: ClientConfig,
    grad: GradFn,
    start: Weights,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    proximal_mu: float = 0.0,
    adam_smoothing: float = 0.0,
) -> Weights:
    """The weights after the client's optimiser took one step per ``(x, y)`` in ``batches``.

    ``adam_smoothing``: Adam's first steps are nearly ``lr * sign(g)``, whose
    derivative in the data is zero almost everywhere. With ``s > 0`` the
    weights are still computed exactly, but their derivative is taken as if
    Adam's denominator had ``s * RMS(sqrt(v_hat))`` of each tensor added
    (a soft sign, straight-through), so an attack can descend (0: exact
    derivative too). FedProx's ``mu (w - w_start)`` joins the gradient
    before the optimiser sees it, as the client's loss adds it.
    """
    weights = dict(start)
    names = list(start)
    momentum: Weights = {}
    second: Weights = {}
    beta1, beta2 = ADAM_BETAS
    for t, (x, y) in enumerate(batches, start=1):
        g = grad(weights, x, y)
        g = {n: g[n] + proximal_mu * (weights[n] - start[n]) for n in names}
        if cfg.optimizer == "sgd":
            if cfg.weight_decay:
                g = {n: g[n] + cfg.weight_decay * weights[n] for n in names}
            if cfg.momentum:
                # torch.optim.SGD: the buffer starts as the first gradient (dampening 0).
                momentum = g if t == 1 else {n: cfg.momentum * momentum[n] + g[n] for n in names}
                g = momentum
            weights = {n: weights[n] - cfg.lr * g[n] for n in names}
            continue
        if cfg.optimizer == "adamw":
            weights = {n: weights[n] * (1 - cfg.lr * cfg.weight_decay) for n in names}
        elif cfg.weight_decay:  # Adam's weight decay is an L2 term in the gradient
            g = {n: g[n] + cfg.weight_decay * weights[n] for n in names}
        if t == 1:
            momentum = {n: torch.zeros_like(w) for n, w in weights.items()}
            second = {n: torch.zeros_like(w) for n, w in weights.items()}
        momentum = {n: beta1 * momentum[n] + (1 - beta1) * g[n] for n in names}
        second = {n: beta2 * second[n] + (1 - beta2) * g[n].square() for n in names}
        step_size = cfg.lr / (1 - beta1**t)
        root_correction = (1 - beta2**t) ** 0.5
        # The tiny floor keeps sqrt's derivative finite where an entry never moved.
        tiny = torch.finfo(start[names[0]].dtype).tiny
        for n in names:
            root = (second[n] + tiny).sqrt() / root_correction
            step = momentum[n] / (root + ADAM_EPS)
            if adam_smoothing:
                # Exact forward, smoothed backward (straight-through): the objective
                # keeps its minimum at the truth and gets a usable gradient.
                eps = ADAM_EPS + adam_smoothing * root.square().mean().sqrt()
                smooth = momentum[n] / (root + eps)
                step = step.detach() + smooth - smooth.detach()
            weights[n] = weights[n] - step_size * step
    return weights


def replays_updates(setting: AttackSetting) -> bool:
    """Whether the server can replay the clients' local training (updates, a known optimiser
    state: :func:`replay_refusal`)."""
    return setting.threat_model == ThreatModel.UPDATE and replay_refusal(setting.client) is None
