"""Client-side defences: what a client does to what it uploads, before the server sees it.

The threat is fedsim's honest-but-curious server, which reads every client's
reply. Flower's central-DP wrappers (a scenario's ``[central-dp]``,
:mod:`fedsim.strategies.central_dp`) add noise to the *aggregate* on the server:
each client's reply (or, behind secure aggregation, their sum) reaches the server
before the noise, so they protect the released model from third parties but not
the clients from a curious server (fedsim's audit attacks exactly those replies).
Defences that do protect against it act on the client, so the server only ever
holds the defended upload; a scenario lists them as ``[[defences]]`` tables:

- ``gaussian`` (``sigma``) and ``laplace`` (``scale``): i.i.d. noise added to every
  coordinate of the update ``w - w_global``;
- ``clip`` (``max-norm``): the update's L2 norm (over all uploaded parameters)
  scaled down to at most ``max-norm``;
- ``prune`` (``share``, ``scope``): the smallest ``share`` of the update's magnitudes
  zeroed, per tensor or globally (DLG's own defence, Zhu et al. 2019);
- ``quantize`` (``bits``, or ``half = true``): symmetric uniform quantisation of each
  tensor, or a cast to half precision;
- ``soteria`` (``share``): representation perturbation (Sun et al., CVPR 2021), for the
  audit's ``probe`` threat model only: in the probed gradient, the weight gradient of
  the first linear layer after the extractor loses the columns of the ``share`` of
  its input features whose input sensitivity ``||dr_f/dX|| / (r_f + 0.1)`` is
  smallest; the client's training uploads are left as trained;
- ``dp-sgd`` (``noise-multiplier``, ``max-grad-norm``, ``delta``, ``accountant``):
  local training with Opacus, per-example gradient clipping and Gaussian noise
  at every step; the client reports the epsilon spent so far (record-level
  (epsilon, delta)-DP of its own data, Opacus's accountant) as ``dp-epsilon``
  every round it trains.

Upload defences chain in the listed order, like pfl-research's postprocessors
(``clip`` then ``gaussian`` is local DP-FedAvg's mechanism, without its
accounting). Noise comes from generators seeded by the scenario seed, the round
and the partition, so runs repeat exactly. Only trainable parameters are
defended: normalisation running statistics (FedCG's generator) are uploaded as
computed, as Opacus refuses such layers for the same reason. Flower's own
``LocalDpMod`` is the clip-and-noise mechanism too, unseeded and only for
replies with the keys they were sent.

Under the audit's ``probe`` threat model the server attacks the gradient of one
batch, the upload of a client sharing gradients (the papers' setting; FedCG
Table 2 adds its noise "to shared gradients"): the same chain acts on that
gradient, in gradient units, and ``dp-sgd`` clips it and adds the noise of one
DP-SGD step (exact for a probe batch of one; a larger batch is clipped as a whole).
``soteria`` acts only there: it reads the probed batch and the model at the sent
weights (a :class:`ProbeContext`, which every other defence ignores), and
validation refuses it under the other threat models, where an update is many
steps of training it would have to perturb at each.

``dp-sgd`` covers :func:`fedsim.core.training.train_local`, hence FedAvg,
FedSplit, local and FedCG's first stage, and FedCG's GAN stage: there only the
discriminator reads data (the extractor's features of real images), so its
steps are DP-SGD steps (:meth:`DPTraining.private_gradients`, per-example
clipping and noise, accounted with the first stage's), its BatchNorm layers
frozen at their running statistics so that no example reaches another's
output; the uploaded generator learns only through it, so it is covered by
post-processing. Limits: it refuses FedProx, whose proximal term Opacus's
optimiser would drop, and models with BatchNorm. The accountant assumes
Poisson sampling at rate batch/examples, where clients draw shuffled batches
(the usual approximation).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord
from torch import nn

from fedsim.clients.base import ClientEnv, ClientRoutine, ClientSpec
from fedsim.core import protocol
from fedsim.core.components import Resolved, resolve
from fedsim.core.config import ClientConfig, ComponentConfig, ScenarioError, require
from fedsim.core.models import MODELS, InputSpec, build_model
from fedsim.core.registry import Registry
from fedsim.core.seeds import SeedStream, derive_seed, stream_rng
from fedsim.core.training import TRAINING_HOOK

if TYPE_CHECKING:
    from opacus import GradSampleModule

# Opacus is imported where DP-SGD runs: it adds seconds to every client actor's start.
Tensors = dict[str, torch.Tensor]

ACCOUNTANT_KEY = "dp-sgd-accountant"


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


def _noise(draw: Any, like: torch.Tensor, width: float) -> torch.Tensor:
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

    def training(self, env: ClientEnv, server_round: int) -> DPTraining | None:
        """A hook for :func:`fedsim.core.training.train_local`, or ``None``."""
        return None


DEFENCES: Registry[Any] = Registry(
    "defence", group="fedsim.defences", subclass_of=Defence, needs=("Params",)
)


@dataclass(frozen=True)
class GaussianParams:
    """``sigma``: standard deviation of the noise on every uploaded coordinate."""

    sigma: float

    def __post_init__(self) -> None:
        require(self.sigma >= 0, "sigma", self.sigma, "must be >= 0")


@DEFENCES.register("gaussian")
class GaussianNoise(Defence):
    """Adds N(0, sigma^2) to every coordinate of the upload."""

    Params = GaussianParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        return {k: t + _noise(rng.normal, t, self.params.sigma) for k, t in update.items()}


@dataclass(frozen=True)
class LaplaceParams:
    """``scale``: the Laplace scale b (standard deviation b * sqrt(2)) per coordinate."""

    scale: float

    def __post_init__(self) -> None:
        require(self.scale >= 0, "scale", self.scale, "must be >= 0")


@DEFENCES.register("laplace")
class LaplaceNoise(Defence):
    """Adds Laplace(0, scale) noise to every coordinate of the upload."""

    Params = LaplaceParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        return {k: t + _noise(rng.laplace, t, self.params.scale) for k, t in update.items()}


@dataclass(frozen=True)
class ClipParams:
    """``max-norm``: bound on the L2 norm of the whole update."""

    max_norm: float

    def __post_init__(self) -> None:
        require(self.max_norm > 0, "max-norm", self.max_norm, "must be > 0")


@DEFENCES.register("clip")
class NormClip(Defence):
    """Scales the update down to L2 norm ``max-norm`` when it is longer."""

    Params = ClipParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        return clip_to_norm(update, self.params.max_norm)


@dataclass(frozen=True)
class PruneParams:
    """``share``: the fraction of the update's entries with the smallest magnitudes set to 0;
    ``scope``: ranked within each tensor (``layer``) or over the whole update (``global``)."""

    share: float
    scope: Literal["layer", "global"] = "layer"

    def __post_init__(self) -> None:
        require(0 <= self.share < 1, "share", self.share, "must be in [0, 1)")
        require(
            self.scope in ("layer", "global"), "scope", self.scope, 'must be "layer" or "global"'
        )


def _smallest_zeroed(values: torch.Tensor, count: int) -> torch.Tensor:
    """``values`` (flat) with its ``count`` smallest magnitudes set to 0 (ties by position)."""
    out = values.clone()
    out[torch.argsort(values.abs(), stable=True)[:count]] = 0
    return out


@DEFENCES.register("prune")
class Prune(Defence):
    """Gradient pruning, DLG's own defence (Zhu et al. 2019, section 5: above about 20 %
    of the smallest magnitudes zeroed, DLG fails): the smallest ``share`` of the update's
    entries by magnitude are zeroed, per tensor or over the whole update."""

    Params = PruneParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        share = self.params.share
        if share == 0:
            return update
        if self.params.scope == "layer":
            return {
                k: _smallest_zeroed(t.flatten(), int(share * t.numel())).reshape(t.shape)
                for k, t in update.items()
            }
        flat = torch.cat([t.flatten() for t in update.values()])
        pruned = _smallest_zeroed(flat, int(share * flat.numel())).split(
            [t.numel() for t in update.values()]
        )
        return {k: p.reshape(t.shape) for (k, t), p in zip(update.items(), pruned, strict=True)}


@dataclass(frozen=True)
class QuantizeParams:
    """``bits``: each tensor rounded to ``2^(bits-1) - 1`` levels either side of 0, up to its
    largest magnitude (symmetric uniform quantisation, round to nearest); ``half``: cast to
    IEEE half precision instead (``bits`` must then be 16)."""

    bits: int = 8
    half: bool = False

    def __post_init__(self) -> None:
        require(2 <= self.bits <= 16, "bits", self.bits, "must be in [2, 16]")
        require(
            not self.half or self.bits == 16,
            "half",
            self.half,
            "half precision is 16 bits: set bits = 16 or half = false",
        )


@DEFENCES.register("quantize")
class Quantize(Defence):
    """The update quantised before upload, as communication-efficient FL does."""

    Params = QuantizeParams

    def protect(self, update: Tensors, rng: np.random.Generator) -> Tensors:
        if self.params.half:
            return {k: t.half().to(t.dtype) for k, t in update.items()}
        levels = 2 ** (self.params.bits - 1) - 1
        out = {}
        for k, t in update.items():
            step = float(t.abs().max()) / levels
            out[k] = t if step == 0 else torch.round(t / step) * step
        return out


@dataclass(frozen=True)
class SoteriaParams:
    """``share``: the fraction of the defended layer's input features whose weight-gradient
    columns are zeroed (the authors' ``pruning_rate`` / 100; 0.6 is their README's
    Inverting Gradients example, ``--pruning_rate=60``)."""

    share: float = 0.6

    def __post_init__(self) -> None:
        require(0 <= self.share < 1, "share", self.share, "must be in [0, 1)")


def defended_linear(model: nn.Module) -> tuple[str, nn.Linear]:
    """The layer Soteria defends: the first ``nn.Linear`` of ``model.classifier`` (the layer
    right after the feature extractor), with its qualified name."""
    classifier = getattr(model, "classifier", model)
    prefix = "classifier." if classifier is not model else ""
    for name, module in classifier.named_modules():
        if isinstance(module, nn.Linear):
            return prefix + name, module
    raise ValueError("soteria needs a model whose classifier has an nn.Linear layer")


def soteria_ratios(model: nn.Module, inputs: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Per feature f of the defended layer's input r: ``sum_b ||dr_f/dX_b|| / (r_bf + 0.1)``
    over the batch (Soteria's score, Sun et al. 2021; the authors' code loops over f).

    One forward pass; the input gradients of ``chunk`` features at a time come from one
    batched backward (one-hot cotangents). The model runs in eval mode, as the probe does.
    """
    _, layer = defended_linear(model)
    captured: list[torch.Tensor] = []
    hook = layer.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
    was_training = model.training
    model.eval()
    try:
        x = inputs.detach().clone().requires_grad_(True)
        model(x)
    finally:
        hook.remove()
        model.train(was_training)
    r = captured[0].flatten(1)  # [B, F]
    batch, features = r.shape
    norms = torch.empty(features, batch, dtype=r.dtype)
    eye = torch.eye(features, dtype=r.dtype, device=r.device)
    for start in range(0, features, chunk):
        stop = min(start + chunk, features)
        cotangents = eye[start:stop, None, :].expand(stop - start, batch, features)
        (grads,) = torch.autograd.grad(
            r, x, grad_outputs=cotangents, retain_graph=True, is_grads_batched=True
        )
        norms[start:stop] = grads.flatten(2).norm(dim=2).detach().cpu()
    return (norms / (r.detach().cpu().T + 0.1)).sum(dim=1)


@DEFENCES.register("soteria")
class Soteria(Defence):
    """Soteria (Sun et al., CVPR 2021), representation perturbation of one shared gradient:
    the ``share`` of the defended layer's input features with the smallest
    :func:`soteria_ratios` lose their columns of that layer's weight gradient (set to 0);
    every other tensor is shared as computed. It reads the probed batch and the model
    (:class:`ProbeContext`), so it acts only under the audit's ``probe`` threat model;
    training uploads pass unchanged."""

    Params = SoteriaParams
    probe_only = True

    def check(self, client: ClientSpec, strategy: str, key: str) -> None:
        spec = InputSpec(3, client.data.image_size, 10)  # layer types do not depend on it
        with torch.device("meta"):
            model = MODELS.get(client.model.name)(spec)
        try:
            defended_linear(model)
        except ValueError as err:
            raise ScenarioError(key, "soteria", str(err)) from None

    def mask(self, context: ProbeContext) -> torch.Tensor:
        """True for the features kept, False for the ``int(share * F)`` smallest ratios (ties
        by position)."""
        ratios = soteria_ratios(context.model, context.inputs)
        keep = torch.ones(len(ratios), dtype=torch.bool)
        keep[torch.argsort(ratios, stable=True)[: int(self.params.share * len(ratios))]] = False
        return keep

    def protect_gradient(
        self,
        gradient: Tensors,
        batch_size: int,
        rng: np.random.Generator,
        context: ProbeContext | None = None,
    ) -> Tensors:
        if context is None:
            raise ValueError("soteria needs the probed batch and model (a ProbeContext)")
        name, _ = defended_linear(context.model)
        key = name + ".weight"
        if self.params.share == 0 or key not in gradient:
            return gradient
        weight = gradient[key]
        dropped = ~self.mask(context).to(weight.device)
        return {**gradient, key: weight.masked_fill(dropped, 0)}


@dataclass(frozen=True)
class DPSGDParams:
    """Opacus DP-SGD: per-example clipping norm, noise std / norm, accounting delta."""

    noise_multiplier: float = 1.0
    max_grad_norm: float = 1.0
    delta: float = 1e-5
    accountant: Literal["rdp", "prv"] = "rdp"

    def __post_init__(self) -> None:
        require(self.noise_multiplier > 0, "noise-multiplier", self.noise_multiplier, "must be > 0")
        require(self.max_grad_norm > 0, "max-grad-norm", self.max_grad_norm, "must be > 0")
        require(0 < self.delta < 1, "delta", self.delta, "must be in (0, 1)")


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
        return {k: t + _noise(rng.normal, t, std) for k, t in clipped.items()}

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


def resolve_defences(defences: tuple[ComponentConfig, ...]) -> tuple[Resolved, ...]:
    """A scenario's ``[[defences]]``, in order, each resolved into its class and
    validated parameters (once, by validation; clients receive them in their spec)."""
    return tuple(resolve(DEFENCES, cfg, f"defences[{i}]") for i, cfg in enumerate(defences))


def defence_chain(client: ClientSpec) -> list[Defence]:
    """The client's defences, in order, built from their resolved parameters."""
    return [resolved.create() for resolved in client.defences]


def check_defences(client: ClientSpec, strategy: str) -> None:
    """The client's defences fit it and ``strategy`` (combinations, the model; against the
    audit's threat model: :func:`fedsim.scenario.applicability.check_defence_threat`)."""
    for resolved, defence in zip(client.defences, defence_chain(client), strict=True):
        defence.check(client, strategy, resolved.key)
    names = [d.name for d in client.defences]
    require(names.count("dp-sgd") <= 1, "defences", names, "list dp-sgd at most once")


def protect_upload(
    chain: list[Defence],
    sent: ArrayRecord,
    reply: ArrayRecord,
    parameter_names: set[str],
    rng: np.random.Generator,
) -> ArrayRecord:
    """``reply`` with the update of each trainable parameter passed through ``chain``.

    The update is ``reply - sent`` for tensors the server sent, the tensor
    itself otherwise.
    """
    received = sent.to_torch_state_dict()
    uploaded = dict(reply.to_torch_state_dict())
    names = [k for k in uploaded if k in parameter_names and uploaded[k].is_floating_point()]
    update = {k: uploaded[k] - received[k] if k in received else uploaded[k] for k in names}
    computed = dict(update)
    for defence in chain:
        update = defence.protect(update, rng)
    for k in names:
        if update[k] is not computed[k]:  # untouched: the upload as trained, bit for bit
            uploaded[k] = update[k] + received[k] if k in received else update[k]
    return ArrayRecord(uploaded)


def train_defended(
    routine: ClientRoutine, env: ClientEnv, sent: ArrayRecord, config: ConfigRecord
) -> tuple[ArrayRecord, dict[str, Any]]:
    """Run ``routine.train`` under the scenario's defences (the client app's train handler)."""
    chain = defence_chain(env.spec)
    if not chain:
        return routine.train(env, sent, config)
    server_round = protocol.read_int(config, protocol.SERVER_ROUND)
    hooks = [h for h in (d.training(env, server_round) for d in chain) if h is not None]
    token = TRAINING_HOOK.set(hooks[0] if hooks else None)
    try:
        arrays, metrics = routine.train(env, sent, config)
    finally:
        TRAINING_HOOK.reset(token)
    names = {n for n, _ in routine.build(env, sent).named_parameters()}
    rng = stream_rng(SeedStream.DEFENCE_UPLOAD, env.spec.seed, server_round, env.partition_id)
    arrays = protect_upload(chain, sent, arrays, names, rng)
    for hook in hooks:
        hook.save()
        metrics[protocol.DP_EPSILON] = hook.epsilon()
    return arrays, metrics


def protect_probe(
    client: ClientSpec,
    gradient: Tensors,
    batch_size: int,
    server_round: int,
    partition: int,
    context: ProbeContext | None = None,
) -> Tensors:
    """The probe gradient as a client with its defences would share it (``context``: the
    probed batch and the model at the sent weights, for defences that read them)."""
    rng = stream_rng(SeedStream.DEFENCE_PROBE, client.seed, server_round, partition)
    for defence in defence_chain(client):
        gradient = defence.protect_gradient(gradient, batch_size, rng, context)
    return gradient
