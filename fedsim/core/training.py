"""Local training and evaluation loops shared by clients, the server and benches.

Batches are drawn by indexing in-memory tensors with a seeded permutation (no
DataLoader workers: a simulated client is one Ray actor on one core).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch
from torch import nn

from fedsim.core.config import ClientConfig
from fedsim.core.modality import of_inputs
from fedsim.core.toml_tables import parse_table

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy_loss(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """The plain supervised objective: mean cross-entropy (next-token for token sequences),
    as the batch's modality (:mod:`fedsim.core.modality`) defines it."""
    return of_inputs(images).loss(model, images, labels)


@dataclass(frozen=True)
class TrainStats:
    """What one local training run did."""

    mean_loss: float
    steps: int
    examples: int


def client_config_record(cfg: ClientConfig) -> dict[str, Any]:
    """Flatten the client config for a Flower ``ConfigRecord`` (kebab-case keys)."""
    return {f.name.replace("_", "-"): getattr(cfg, f.name) for f in fields(cfg)}


def client_config_from_record(record: Any) -> ClientConfig:
    """Read back what :func:`client_config_record` wrote (other keys ignored)."""
    keys = {f.name.replace("_", "-") for f in fields(ClientConfig)}
    return parse_table(ClientConfig, {k: record[k] for k in keys if k in record}, "client")


def examples_touched(num_examples: int, cfg: ClientConfig) -> int:
    """How many distinct examples one round of local training touches (public: from the config)."""
    if cfg.local_steps:
        return min(num_examples, cfg.batch_size * cfg.local_steps)
    return num_examples


def make_optimizer(params: Any, cfg: ClientConfig) -> torch.optim.Optimizer:
    """The optimiser the client config names."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def optimizer_tensors(optimizer: torch.optim.Optimizer, prefix: str) -> dict[str, torch.Tensor]:
    """``optimizer``'s per-parameter state as flat tensors ``<prefix>.<param>.<field>``.

    What a kept optimiser carries to the next round (Adam: ``step``, ``exp_avg``,
    ``exp_avg_sq``); the hyper-parameters come from the config each round.
    """
    out = {}
    for index, fields_ in optimizer.state_dict()["state"].items():
        for name, value in fields_.items():
            tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            out[f"{prefix}.{index}.{name}"] = tensor.detach().cpu().clone()
    return out


def load_optimizer_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], prefix: str
) -> None:
    """Give ``optimizer`` (built over the same parameters) the state :func:`optimizer_tensors`
    took under ``prefix``; nothing to load leaves it fresh."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        head, _, name = key.rpartition(".")
        owner, _, index = head.rpartition(".")
        if owner == prefix:
            state.setdefault(int(index), {})[name] = tensor
    if state:
        param_groups = optimizer.state_dict()["param_groups"]
        optimizer.load_state_dict({"state": state, "param_groups": param_groups})


def augment_batch(x: torch.Tensor, cfg: ClientConfig, generator: torch.Generator) -> torch.Tensor:
    """The config's augmentation of one training batch (``hflip``: mirror each with p = 1/2)."""
    if cfg.augment == "none":
        return x
    flip = (torch.rand(len(x), generator=generator) < 0.5).to(x.device)
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def batch_indices(
    num_examples: int, cfg: ClientConfig, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """Minibatch index tensors: ``local_steps`` batches if set, else full epochs."""
    if cfg.local_steps:
        produced = 0
        while produced < cfg.local_steps:
            order = torch.randperm(num_examples, generator=generator)
            for start in range(0, num_examples, cfg.batch_size):
                if produced == cfg.local_steps:
                    return
                yield order[start : start + cfg.batch_size]
                produced += 1
        return
    for _ in range(cfg.local_epochs):
        order = torch.randperm(num_examples, generator=generator)
        for start in range(0, num_examples, cfg.batch_size):
            yield order[start : start + cfg.batch_size]


def smallest_batch(num_examples: int, cfg: ClientConfig) -> int:
    """The smallest minibatch :func:`batch_indices` yields for ``num_examples``."""
    full, left = divmod(num_examples, cfg.batch_size)
    reached = not cfg.local_steps or cfg.local_steps > full  # the epoch's short last batch
    return left if left and reached else min(num_examples, cfg.batch_size)


class TrainingHook(Protocol):
    """Changes how :func:`train_local` steps (DP-SGD: per-example clipping and noise)."""

    def attach(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: ClientConfig, examples: int
    ) -> torch.optim.Optimizer: ...

    def detach(self, model: nn.Module) -> None: ...


# Set around a client's whole train handler (clients/defences/chain.py), so that every
# routine's local training honours a DP-SGD defence without passing it down.
TRAINING_HOOK: ContextVar[TrainingHook | None] = ContextVar("training_hook", default=None)


def train_local(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    cfg: ClientConfig,
    seed: int,
    loss_fn: LossFn = cross_entropy_loss,
    parameters: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> TrainStats:
    """Train ``model`` in place on ``(images, labels)`` as ``cfg`` says.

    ``parameters`` restricts what is optimised (default: all of the model's);
    ``optimizer``: one over those parameters whose state carries over from
    earlier rounds (default: a fresh one of the config's).
    """
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if optimizer is None:
        optimizer = make_optimizer(
            parameters if parameters is not None else model.parameters(), cfg
        )
    hook = TRAINING_HOOK.get()
    if hook is not None:
        optimizer = hook.attach(model, optimizer, cfg, len(labels))
    model.train()
    total, steps = 0.0, 0
    for idx in batch_indices(len(labels), cfg, generator):
        x, y = augment_batch(images[idx].to(device), cfg, generator), labels[idx].to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, x, y)
        loss.backward()
        optimizer.step()
        total += float(loss.detach())
        steps += 1
    if hook is not None:
        hook.detach(model)
    return TrainStats(mean_loss=total / max(1, steps), steps=steps, examples=len(labels))


@torch.no_grad()
def evaluate(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 1000
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``(images, labels)`` (per predicted
    token for token sequences: the modality's :meth:`~fedsim.core.modality.Modality.scores`)."""
    if len(labels) == 0:
        return float("nan"), float("nan")
    device = next(model.parameters()).device
    model.eval()
    loss_sum, correct, made = 0.0, 0, 0
    scores = of_inputs(images).scores
    for start in range(0, len(labels), batch_size):
        x = images[start : start + batch_size].to(device)
        y = labels[start : start + batch_size].to(device)
        batch_loss, batch_correct, batch_made = scores(model, x, y)
        loss_sum, correct, made = loss_sum + batch_loss, correct + batch_correct, made + batch_made
    return loss_sum / made, correct / made
