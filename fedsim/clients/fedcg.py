"""FedCG's client (Wu et al. 2022, Algorithm 1): two stages per round.

The client's network is a :class:`~fedsim.core.gan.GanSplitNet`: extractor E_i,
classifier C_i, generator G_i and discriminator D_i. It receives the global
classifier and generator (``classifier.*``, ``generator.*``), then

1. trains E_i and C_i (C_i starts from the global classifier) on
   ``CE(C(E(x)), y) + gamma * MSE(E(x), G_g(z, y))``, the received global
   generator G_g frozen, ``gamma`` from the train config;
2. freezes E_i and trains G_i (starting from G_g) and D_i as a conditional
   GAN on ``(E_i(x), y)`` against ``(G_i(z, y), y)``, Adam betas (0.5, 0.999),
   plus the optional diversity (mode-seeking) loss
   ``w / (mean|G(z1, y) - G(z2, y)| / mean|z1 - z2| + 1e-5)``.

Under a ``dp-sgd`` defence both stages are DP-SGD: stage 1 through
:func:`~fedsim.core.training.train_local`'s training hook, stage 2's
discriminator steps (the only ones reading data) through
:meth:`~fedsim.clients.defences.dp_sgd.DPTraining.private_gradients`, with the
discriminator's BatchNorm layers frozen at their running statistics; the
generator learns only through the discriminator.

It uploads ``classifier.*`` (C_i after stage 1) and ``generator.*`` (G_i,
BatchNorm buffers included); E_i and D_i stay private
(:mod:`fedsim.clients.private_state`). Evaluation is FedSplit's personalised one.
Both stages use the client config's optimiser settings (lr, weight decay;
under ``fedcg-protocol = "paper"`` the GAN Adams have none, as in the
authors' code); with ``optimizer-state = "kept"`` all three Adams (stage 1,
discriminator, generator) carry their state to the client's next round.
Stage 2 runs ``fedcg-gan-steps`` minibatches when the config sets it, else as
many as stage 1. Replies add stage 1's ``fedcg-ce-loss`` and ``fedcg-mse``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord
from torch import nn

from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientEnv
from fedsim.clients.defences import DPTraining
from fedsim.clients.fedsplit import FedSplitClient
from fedsim.clients.private_state import KeptOptimizers
from fedsim.core import protocol
from fedsim.core.config import ClientConfig
from fedsim.core.gan import ConditionalGenerator, GanSplitNet, build_gan_split_net
from fedsim.core.models import SplitNet
from fedsim.core.seeds import SeedStream, derive_seed
from fedsim.core.training import (
    TRAINING_HOOK,
    augment_batch,
    batch_indices,
    client_config_from_record,
    make_optimizer,
    train_local,
)


class TaskLoss:
    """Stage 1 for ``net``: ``CE(C(E(x)), y) + gamma * MSE(E(x), G_g(z, y))``, G_g frozen.

    A :data:`~fedsim.core.training.LossFn` that also sums its two terms (the MSE
    before ``gamma``), so a round's report can show which one moved.
    """

    def __init__(self, net: SplitNet, global_generator: ConditionalGenerator, gamma: float):
        self.net, self.global_generator, self.gamma = net, global_generator, gamma
        self.ce_total, self.mse_total, self.steps = 0.0, 0.0, 0

    def __call__(self, _: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = self.net.extractor(images)
        ce = F.cross_entropy(self.net.classifier(features), labels)
        z = torch.randn(len(labels), self.global_generator.noise_dim, device=images.device)
        with torch.no_grad():
            target = self.global_generator(z, labels)
        mse = F.mse_loss(features, target)
        self.ce_total += float(ce.detach())
        self.mse_total += float(mse.detach())
        self.steps += 1
        return ce + self.gamma * mse

    def means(self) -> dict[str, float]:
        """Mean cross-entropy and mean (unweighted) MSE over the steps taken."""
        steps = max(1, self.steps)
        return {
            protocol.FEDCG_CE: self.ce_total / steps,
            protocol.FEDCG_MSE: self.mse_total / steps,
        }


@dataclass(frozen=True)
class GanStats:
    """Mean discriminator and generator losses over stage 2."""

    d_loss: float
    g_loss: float


def diversity_loss(
    fake: torch.Tensor, other: torch.Tensor, z: torch.Tensor, z_other: torch.Tensor
) -> torch.Tensor:
    """Mode-seeking term (Mao et al. 2019): large when different noise gives alike features."""
    ratio = (fake - other).abs().mean() / (z - z_other).abs().mean()
    return 1.0 / (ratio + 1e-5)


def discriminator_loss(
    discriminator: nn.Module, real: torch.Tensor, fake: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """``BCE(D(real, y), 1) + BCE(D(fake, y), 0)``, means over the batch."""
    ones, zeros = torch.ones(len(y), device=y.device), torch.zeros(len(y), device=y.device)
    return F.binary_cross_entropy(discriminator(real, y), ones) + F.binary_cross_entropy(
        discriminator(fake, y), zeros
    )


def example_loss(
    discriminator: nn.Module, real: torch.Tensor, fake: torch.Tensor, y: torch.Tensor, i: int
) -> torch.Tensor:
    """:func:`discriminator_loss` of the batch's ``i``-th real and fake example."""
    one = slice(i, i + 1)
    return discriminator_loss(discriminator, real[one], fake[one], y[one])


def gan_optimizers(
    net: GanSplitNet, cfg: ClientConfig, weight_decay: float
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """Fresh Adams (betas (0.5, 0.999)) for the discriminator and the generator."""
    opt_d, opt_g = (
        torch.optim.Adam(m.parameters(), cfg.lr, betas=(0.5, 0.999), weight_decay=weight_decay)
        for m in (net.discriminator, net.generator)
    )
    return opt_d, opt_g


def train_gan(
    net: GanSplitNet,
    images: torch.Tensor,
    labels: torch.Tensor,
    cfg: ClientConfig,
    seed: int,
    diversity_weight: float,
    optimizers: tuple[torch.optim.Optimizer, torch.optim.Optimizer] | None = None,
) -> GanStats:
    """Stage 2: the conditional GAN on the frozen extractor's features.

    ``optimizers``: the discriminator's and the generator's (default: fresh
    :func:`gan_optimizers` with the config's weight decay). Training images
    get the config's augmentation, as in stage 1. Under DP-SGD (a
    :class:`~fedsim.clients.defences.dp_sgd.DPTraining` training hook) each
    discriminator step is a private one.
    """
    hook = TRAINING_HOOK.get()
    private = hook if isinstance(hook, DPTraining) else None
    device = next(net.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt_d, opt_g = optimizers or gan_optimizers(net, cfg, cfg.weight_decay)
    net.extractor.eval()
    net.generator.train()
    net.discriminator.train()
    if private is not None:  # batch statistics would mix the examples of a batch
        for layer in net.discriminator.modules():
            if isinstance(layer, nn.modules.batchnorm._BatchNorm):
                layer.eval()
    d_total, g_total, steps = 0.0, 0.0, 0
    for idx in batch_indices(len(labels), cfg, generator):
        x, y = augment_batch(images[idx].to(device), cfg, generator), labels[idx].to(device)
        with torch.no_grad():
            real = net.extractor(x)
        z = torch.randn(len(y), net.generator.noise_dim, device=device)
        fake = net.generator(z, y)
        fixed = fake.detach()  # the discriminator's step leaves the generator alone
        opt_d.zero_grad(set_to_none=True)
        if private is None:
            d_loss = discriminator_loss(net.discriminator, real, fixed, y)
            d_loss.backward()
        else:
            d_loss = torch.tensor(
                private.private_gradients(
                    net.discriminator,
                    functools.partial(example_loss, net.discriminator, real, fixed, y),
                    len(y),
                    cfg,
                    len(labels),
                )
            )
        opt_d.step()

        ones = torch.ones(len(y), device=device)
        g_loss = F.binary_cross_entropy(net.discriminator(fake, y), ones)
        if diversity_weight > 0:
            z_other = torch.randn_like(z)
            g_loss = g_loss + diversity_weight * diversity_loss(
                fake, net.generator(z_other, y), z, z_other
            )
        opt_g.zero_grad(set_to_none=True)
        g_loss.backward()
        opt_g.step()
        d_total, g_total = d_total + float(d_loss.detach()), g_total + float(g_loss.detach())
        steps += 1
    return GanStats(d_total / max(1, steps), g_total / max(1, steps))


@CLIENT_ROUTINES.register("fedcg")
class FedCGClient(FedSplitClient):
    """Uploads classifier and generator; keeps extractor and discriminator."""

    shared_prefixes: ClassVar[tuple[str, ...]] = protocol.FEDCG_SHARED

    def network(self, env: ClientEnv) -> GanSplitNet:
        return build_gan_split_net(env.spec.model, env.input_spec, seed=env.private_seed())

    def train(
        self, env: ClientEnv, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord, dict[str, Any]]:
        net = cast(GanSplitNet, self.build(env, arrays))
        images, labels = env.train_data
        cfg = client_config_from_record(config)
        server_round = protocol.read_int(config, protocol.SERVER_ROUND)
        global_generator = copy.deepcopy(net.generator).eval().requires_grad_(False)
        task = TaskLoss(net, global_generator, protocol.read_float(config, protocol.FEDCG_GAMMA))
        stage1 = [*net.extractor.parameters(), *net.classifier.parameters()]
        optimizers = KeptOptimizers(env, cfg)
        stats = train_local(
            net,
            images,
            labels,
            cfg,
            env.seed(server_round),
            loss_fn=task,
            optimizer=optimizers.make("task", make_optimizer(stage1, cfg)),
        )
        gan_steps = int(config.get(protocol.FEDCG_GAN_STEPS, 0))  # type: ignore[arg-type]
        gan_cfg = dataclasses.replace(cfg, local_steps=gan_steps) if gan_steps else cfg
        # The FedCG code's GAN Adams have no weight decay; fedsim's took the client's.
        paper = config.get(protocol.FEDCG_PROTOCOL, "fedsim") == "paper"
        opt_d, opt_g = gan_optimizers(net, cfg, 0.0 if paper else cfg.weight_decay)
        gan = train_gan(
            net,
            images,
            labels,
            gan_cfg,
            derive_seed(SeedStream.FEDCG_GAN, env.spec.seed, server_round, env.partition_id),
            protocol.read_float(config, protocol.FEDCG_DIVERSITY),
            (optimizers.make("discriminator", opt_d), optimizers.make("generator", opt_g)),
        )
        optimizers.save(server_round)
        metrics = {
            protocol.TRAIN_LOSS: stats.mean_loss,
            **task.means(),
            protocol.GAN_D_LOSS: gan.d_loss,
            protocol.GAN_G_LOSS: gan.g_loss,
            protocol.NUM_EXAMPLES: stats.examples,
            **self.evaluate_trained(env, net),
        }
        return self.reply_arrays(env, net, server_round), metrics
