"""``dp-sgd``: local training with Opacus (per-example clipping and Gaussian noise at every
step) and the record-level epsilon a client reports."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ConfigRecord
from torch import nn

from fedsim.clients.base import ClientEnv, ClientSpec
from fedsim.clients.defences.base import (
    DEFENCES,
    Defence,
    ProbeContext,
    Tensors,
    clip_to_norm,
    noise_like,
)
from fedsim.core.config import ClientConfig, ScenarioError, require
from fedsim.core.models import InputSpec, build_model
from fedsim.core.params.defences import DPSGDParams
from fedsim.core.seeds import SeedStream, derive_seed

if TYPE_CHECKING:
    from opacus import GradSampleModule

# Opacus is imported where DP-SGD runs: it adds seconds to every client actor's start.


ACCOUNTANT_KEY = "dp-sgd-accountant"


@DEFENCES.register("dp-sgd")
class DPSGD(Defence):
    """Local training with per-example clipping and Gaussian noise (Opacus), accounted."""

    Params = DPSGDParams

    def check(self, client: ClientSpec, strategy: str, key: str) -> None:
        # Opacus's optimiser replaces each gradient by the noisy sum of clipped
        # per-example gradients: a loss term outside the model (FedProx's) is lost.
        require(
            strategy != "fedprox",
            key,
            "dp-sgd",
            "cannot train FedProx: Opacus drops its proximal term; use fedavg",
        )
        from opacus.validators import ModuleValidator

        spec = InputSpec(3, client.data.image_size, 10)  # layer types do not depend on it
        errors = ModuleValidator.validate(build_model(client.model, spec), strict=False)
        if errors:
            raise ScenarioError(
                key, "dp-sgd", f"Opacus cannot train model {client.model.name!r}: {errors[0]}"
            )

    def protect_gradient(
        self,
        gradient: Tensors,
        batch_size: int,
        rng: np.random.Generator,
        context: ProbeContext | None = None,
    ) -> Tensors:
        p = self.params
        clipped = clip_to_norm(gradient, p.max_grad_norm)
        std = p.noise_multiplier * p.max_grad_norm / batch_size
        return {k: t + noise_like(rng.normal, t, std) for k, t in clipped.items()}

    def training(self, env: ClientEnv, server_round: int) -> DPTraining:
        parts = (env.spec.seed, server_round, env.partition_id)
        seeds = (derive_seed(SeedStream.DP_SGD, *parts), derive_seed(SeedStream.DP_SGD_GAN, *parts))
        return DPTraining(self.params, env, *seeds)


class DPTraining:
    """The :class:`~fedsim.core.training.TrainingHook` of DP-SGD for one client and round.

    The accountant's history (noise multiplier, sample rate, steps) is the
    client's private state: kept in the node state and, like
    :mod:`fedsim.clients.private_state`, in the run's client-state folder, so the
    epsilon of a resumed run goes on growing.
    """

    def __init__(self, params: DPSGDParams, env: ClientEnv, seed: int, manual_seed: int) -> None:
        self.params = params
        self.env = env
        self.seed = seed
        self._manual_noise = torch.Generator().manual_seed(manual_seed)
        from opacus.accountants import create_accountant

        self.accountant = create_accountant(params.accountant)
        self.accountant.history = self._load_history()
        self._wrapped: GradSampleModule | None = None
        self._frozen: list[nn.Parameter] = []

    def attach(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: ClientConfig, examples: int
    ) -> torch.optim.Optimizer:
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
        # Per-example gradients only for what is trained (FedCG's first stage
        # leaves its generator, which has BatchNorm, untouched).
        self._frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in trained]
        for p in self._frozen:
            p.requires_grad_(False)
        self._wrapped = GradSampleModule(model, loss_reduction="mean")
        device = next(model.parameters()).device
        private = DPOptimizer(
            optimizer,
            noise_multiplier=self.params.noise_multiplier,
            max_grad_norm=self.params.max_grad_norm,
            expected_batch_size=cfg.batch_size,
            generator=torch.Generator(device).manual_seed(self.seed),
        )
        rate = min(1.0, cfg.batch_size / max(1, examples))
        z = self.params.noise_multiplier
        private.attach_step_hook(
            lambda _: self.accountant.step(noise_multiplier=z, sample_rate=rate)
        )
        return private

    def detach(self, model: nn.Module) -> None:
        if self._wrapped is not None:
            self._wrapped.remove_hooks()
            self._wrapped = None
        for p in model.parameters():
            p.grad_sample = None  # type: ignore[attr-defined]
        for p in self._frozen:
            p.requires_grad_(True)
        self._frozen = []

    def private_gradients(
        self,
        module: nn.Module,
        example_loss: Callable[[int], torch.Tensor],
        batch: int,
        cfg: ClientConfig,
        examples: int,
    ) -> float:
        """Set ``module``'s gradients to one accounted DP-SGD step's; return the mean loss.

        For steps :func:`~fedsim.core.training.train_local` does not take
        (FedCG's discriminator): the gradient of each of the ``batch`` losses
        ``example_loss(i)`` is clipped to ``max-grad-norm``, they are summed,
        Gaussian noise of std ``noise-multiplier * max-grad-norm`` is added and
        the sum divided by ``batch``, as Opacus's optimiser does.
        """
        p = self.params
        params = [q for q in module.parameters() if q.requires_grad]
        summed = [torch.zeros_like(q) for q in params]
        total = 0.0
        for i in range(batch):
            loss = example_loss(i)
            grads = torch.autograd.grad(loss, params)
            norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
            factor = min(1.0, p.max_grad_norm / (norm + 1e-6))
            for acc, g in zip(summed, grads, strict=True):
                acc.add_(g, alpha=factor)
            total += float(loss.detach())
        std = p.noise_multiplier * p.max_grad_norm
        for q, acc in zip(params, summed, strict=True):
            noise = torch.normal(0.0, std, acc.shape, generator=self._manual_noise)
            q.grad = (acc + noise.to(acc.device)) / batch
        rate = min(1.0, cfg.batch_size / max(1, examples))
        self.accountant.step(noise_multiplier=p.noise_multiplier, sample_rate=rate)
        return total / max(1, batch)

    def epsilon(self) -> float:
        """Epsilon spent by every step so far, at the configured delta (0 before any)."""
        if not self.accountant.history:
            return 0.0
        return float(self.accountant.get_epsilon(delta=self.params.delta))

    def _state_file(self) -> Any:
        assert self.env.state_dir is not None
        return self.env.state_dir / f"dp-sgd-partition-{self.env.partition_id}.json"

    def _load_history(self) -> list[tuple[float, float, int]]:
        record = self.env.state.config_records.get(ACCOUNTANT_KEY)
        if record is not None:
            table: dict[str, Any] = dict(record.items())
        elif self.env.state_dir is not None and self._state_file().is_file():
            table = json.loads(self._state_file().read_text())
        else:
            return []
        return list(zip(table["noise"], table["rate"], table["steps"], strict=True))

    def save(self) -> None:
        """Keep the accountant's history (node state, and the run's client-state folder)."""
        history = self.accountant.history
        table = {
            "noise": [float(h[0]) for h in history],
            "rate": [float(h[1]) for h in history],
            "steps": [int(h[2]) for h in history],
        }
        self.env.state[ACCOUNTANT_KEY] = ConfigRecord(table)  # type: ignore[arg-type]
        if self.env.state_dir is None:
            return
        self.env.state_dir.mkdir(parents=True, exist_ok=True)
        path = self._state_file()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(table))
        os.replace(tmp, path)
