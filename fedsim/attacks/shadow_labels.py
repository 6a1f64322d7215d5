"""``shadow-labels``: class counts from a regression fitted on shadow updates.

The server knows the round's client configuration (it sends it) and holds
public labelled data (:attr:`~fedsim.attacks.leakage.LeakInput.public`). So,
once per round and for all of the round's clients, it simulates a pool of
*shadow clients*: subsets of its public data with known class mixes (IID ones
among them, the rest drawn from Dirichlet priors), each trained from the sent
model with the client's own routine (:func:`~fedsim.core.training.train_local`,
the scenario's epochs, batch size, optimiser and learning rate). From each
shadow update it reads four features per class, centred over the classes:

- the output layer's bias update and weight-row-sum update (LLG's signal);
- the uploaded model's mean logit shift on the public images, and its softmax
  (``logit-shift``'s signal; a label-shift estimate);

each also times the log of the client's examples (a round's clients differ in
size), and fits one class-symmetric ridge regression from them to the shadow's
class shares minus the public data's class mix. A client's estimate is that mix
plus the regression's reading of its own features, clipped at zero: where the
features carry nothing (IID clients, whose mixes the shadow pool includes) the
fit learns to say little, and the estimate stays near the data-free prior
(Wainakh et al.'s LLG* idea of calibrating on auxiliary data, as a regression
on shadow updates, the way membership's shadow models are built).

Cost: ``shadows`` local trainings per round at the round's client sizes
(default 6: about six times one client's training, once per round whatever the
number of clients), plus two forward passes over the public images per shadow
and per client. Defences and FedProx's proximal term are not simulated.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import chisquare
from torch.func import functional_call

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.closed_form import linear_layers
from fedsim.attacks.gradients import victim_model
from fedsim.attacks.label_leaks import LogitShift, public_subset
from fedsim.attacks.leakage import LEAKS, LabelLeak, Leak, LeakAnalysis, LeakInput, PublicData
from fedsim.core.config import require
from fedsim.core.seeds import SeedStream, derive_seed
from fedsim.core.threat import UPDATES
from fedsim.core.training import train_local

FEATURES = 4  # bias, row sum, logit shift, softmax of the logit shift


@dataclass(frozen=True)
class ShadowLabelsParams:
    """``shadow-labels``' settings.

    Attributes
    ----------
    shadows:
        Shadow clients trained per round (shared by the round's clients).
    iid_share:
        Share of the shadows drawn IID from the public data; the rest draw
        class shares from Dirichlet priors of ``alphas`` in turn.
    alphas:
        Dirichlet concentrations of the label-skewed shadows.
    ridge:
        Ridge penalty on the standardised features (per regression row).
    max_examples:
        Cap on a shadow client's examples (0: the round's client sizes as they are).
    """

    shadows: int = 8
    iid_share: float = 0.5
    alphas: tuple[float, ...] = (0.3, 1.0)
    ridge: float = 0.1
    max_examples: int = 0
    gate: float = 3.0

    def __post_init__(self) -> None:
        require(self.shadows >= 2, "shadows", self.shadows, "must be >= 2")
        require(0 <= self.iid_share <= 1, "iid-share", self.iid_share, "must be in [0, 1]")
        require(
            len(self.alphas) >= 1 and all(a > 0 for a in self.alphas),
            "alphas",
            self.alphas,
            "must be one or more concentrations > 0",
        )
        require(self.ridge >= 0, "ridge", self.ridge, "must be >= 0")
        require(self.max_examples >= 0, "max-examples", self.max_examples, "must be >= 0")


def class_mix(public: PublicData, classes: int, level: float = 0.01) -> torch.Tensor:
    """The data-free prior, ``(K,)`` float64: the public data's class shares where a
    chi-square test rejects a uniform mix at ``level``, else uniform (a few hundred
    public examples of balanced classes are a noisier guess than the uniform one:
    TV 0.049 against 0.028 on the demo's IID clients)."""
    counts = torch.bincount(public.labels.long().cpu(), minlength=classes).double()
    if float(chisquare(counts.numpy()).pvalue) >= level:
        return torch.full((classes,), 1 / classes, dtype=torch.float64)
    return counts / counts.sum()


@dataclass(frozen=True)
class _Round:
    """What a round's clients share: the sent model, its mean logits, the public images."""

    model: torch.nn.Module
    sent: dict[str, torch.Tensor]
    prefix: str
    images: torch.Tensor
    sent_logits: torch.Tensor

    def features(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """``(K, FEATURES)``: an update's features, each centred over the classes."""
        bias = (params[f"{self.prefix}.bias"] - self.sent[f"{self.prefix}.bias"]).double()
        weight = params[f"{self.prefix}.weight"] - self.sent[f"{self.prefix}.weight"]
        rows = weight.sum(dim=1).double()
        with torch.no_grad():
            shift = (functional_call(self.model, params, (self.images,)).mean(0)).double()
        shift = shift - self.sent_logits
        columns = [bias, rows, shift, shift.softmax(0)]
        return torch.stack([c - c.mean() for c in columns], dim=1).cpu()


def design(plain: torch.Tensor, offset: torch.Tensor, examples: int) -> torch.Tensor:
    """``(K, 2 * FEATURES)``: features less what an IID client's update shows (the
    classes the sent model under- or over-predicts move whatever the mix), alone and
    times ``log(examples)``."""
    moved = plain - offset
    return torch.cat([moved, moved * math.log(max(examples, 1))], dim=1)


@LEAKS.register("shadow-labels")
class ShadowLabels(LeakAnalysis):
    """Class counts by a ridge regression fitted on shadow clients' updates."""

    Params = ShadowLabelsParams
    params: ShadowLabelsParams
    kind = "labels"
    threat_models = UPDATES

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """What ``logit-shift`` needs: the whole model's update, an output bias, public
        images from a held-out split."""
        LogitShift.check_setting(setting, key)

    def analyse(self, inputs: LeakInput, seed: int = 0) -> LabelLeak:
        """One client: a shadow pool of its own."""
        (leak,) = self.analyse_many([inputs], seed)
        assert isinstance(leak, LabelLeak)
        return leak

    def analyse_many(self, inputs: Sequence[LeakInput], seed: int = 0) -> list[Leak]:
        """A round's clients: one shadow pool per round (they share the sent model)."""
        out: list[Leak] = []
        by_round: dict[int, list[int]] = {}
        for i, one in enumerate(inputs):
            by_round.setdefault(one.observation.round, []).append(i)
        leaks: dict[int, LabelLeak] = {}
        for indices in by_round.values():
            group = [inputs[i] for i in indices]
            for i, leak in zip(indices, self._round(group, seed), strict=True):
                leaks[i] = leak
        out.extend(leaks[i] for i in range(len(inputs)))
        return out

    def _round(self, inputs: Sequence[LeakInput], seed: int) -> list[LabelLeak]:
        start = time.perf_counter()
        first = inputs[0].observation
        public = inputs[0].public
        classes = first.input_spec.num_classes
        shared = self._shared(first, public, seed)
        prior = class_mix(public, classes)
        sizes = [one.observation.num_examples for one in inputs]
        plains, shadow_sizes, y, offset = self._pool(first, public, shared, sizes, prior, seed)
        x = torch.cat([design(f, offset, n) for f, n in zip(plains, shadow_sizes, strict=True)])
        scale = x.std(dim=0).clamp_min(1e-12)
        xs = x / scale
        penalty = self.params.ridge * len(xs) * torch.eye(xs.shape[1], dtype=xs.dtype)
        weights = torch.linalg.solve(xs.T @ xs + penalty, xs.T @ y)
        # James-Stein's positive part: an update no further from the IID shadows' mean
        # than they lie from it is read as the prior.
        iid = [design(plains[i], offset, shadow_sizes[i]) / scale for i in self._iid_at()]
        noise = float(torch.stack([(f**2).sum() for f in iid]).mean()) if iid else 0.0
        fitted = time.perf_counter() - start
        leaks = []
        for one in inputs:
            began = time.perf_counter()
            observation = one.observation
            params = {
                **shared.sent,
                **{n: v.to(self.device) for n, v in observation.shared.items()},
            }
            own = design(shared.features(params), offset, observation.num_examples)
            feats = own / scale
            spread = float((feats**2).sum())
            keep = max(0.0, 1 - self.params.gate * noise / spread) if spread > 0 else 0.0
            shares = (prior + keep * (feats @ weights)).clamp_min(0)
            if float(shares.sum()) <= 0:
                shares = prior.clone()
            counts = shares / shares.sum() * observation.num_examples
            seconds = time.perf_counter() - began + fitted / len(inputs)
            details = {"shadows": self.params.shadows, "pool-seconds": fitted, "kept": keep}
            leaks.append(LabelLeak(counts.float(), seconds, details))
        return leaks

    def _iid_at(self) -> list[int]:
        """Which shadows are IID: ``iid_share`` of them, spread over the sizes."""
        count = round(self.params.iid_share * self.params.shadows)
        if not count:
            return []
        return sorted(set(np.linspace(0, self.params.shadows - 1, count).round().astype(int)))

    def _shared(self, observation: Observation, public: PublicData, seed: int) -> _Round:
        model, sent = victim_model(observation, self.device, seed)
        prefix = linear_layers(model)[-1][0]
        images = public.images.to(self.device)
        with torch.no_grad():
            sent_logits = functional_call(model, sent, (images,)).mean(0).double()
        return _Round(model, sent, prefix, images, sent_logits)

    def _pool(
        self,
        observation: Observation,
        public: PublicData,
        shared: _Round,
        sizes: Sequence[int],
        prior: torch.Tensor,
        seed: int,
    ) -> tuple[list[torch.Tensor], list[int], torch.Tensor, torch.Tensor]:
        """The shadow pool: each shadow's features ``(K, FEATURES)`` and examples, the
        targets ``(S * K,)`` (shares minus the prior), and the IID shadows' mean features
        (all shadows' where none is IID)."""
        p = self.params
        rng = np.random.default_rng(
            [derive_seed(SeedStream.LEAK_ANALYSIS, seed), observation.round]
        )
        classes = len(prior)
        iid_at = self._iid_at()
        quantiles = np.quantile(
            np.asarray(sizes, dtype=float), (np.arange(p.shadows) + 0.5) / p.shadows
        )
        rows, targets, made = [], [], []
        for i in range(p.shadows):
            size = int(max(1, round(quantiles[i])))
            if p.max_examples:
                size = min(size, p.max_examples)
            if i in iid_at:
                idx = torch.from_numpy(rng.choice(len(public), size, replace=True))
            else:
                alpha = p.alphas[i % len(p.alphas)]
                draw = rng.multinomial(size, rng.dirichlet(np.full(classes, alpha)))
                idx = public_subset(public, np.repeat(np.arange(classes), draw), rng)
            labels = public.labels[idx]
            model = shared.model
            with torch.no_grad():
                for name, param in model.named_parameters():
                    param.copy_(shared.sent[name])
            train_local(
                model,
                public.images[idx].to(self.device),
                labels.to(self.device),
                observation.train_config,
                int(rng.integers(2**31)),
            )
            model.eval()
            trained = {n: q.detach().clone() for n, q in model.named_parameters()}
            rows.append(shared.features({**shared.sent, **trained}))
            made.append(size)
            share = torch.bincount(labels.long().cpu(), minlength=classes).double() / size
            targets.append(share - prior)
        iid_rows = [rows[i] for i in iid_at] or rows
        return rows, made, torch.cat(targets), torch.stack(iid_rows).mean(0)
