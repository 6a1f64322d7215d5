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
size). Features are read against a reference: for a shadow, the IID shadows' mean
(classes the sent model under-predicts move whatever the mix); for a client, the
mean of the round's other clients (their mixes average out and, like the client,
they trained on data the model has seen: FedMIA's "all for one"), or the IID
shadows' mean in a round of fewer than ``min-round`` clients. One class-symmetric
regression, ``shares = softmax(log prior + x w)`` (``link = "softmax"``; or ridge
least squares on the shares, ``"linear"``), is fitted on the pool's shares. The
prior is uniform unless the public class mix is clearly skewed (:func:`class_mix`).

A gate keeps the estimate honest where the update says nothing: each IID shadow,
left out of the fit, is read by the others' fit; the mean TV error of those
readings is the estimator's noise on a mix-free update. A client whose estimate
moves no further than ``gate`` times that from the prior is read as the prior,
fully as estimated beyond twice that (linear between). Measured in docs/leaks.md:
on the demo's IID clients it gives the uniform guess (TV 0.028-0.031 where
``logit-shift`` scored 0.12-0.24), on ``audit-realistic``'s Dirichlet-0.3 clients
it beats ``llg`` and ``logit-shift``.

Cost: ``shadows`` local trainings per round at the round's client sizes
(default 8: about eight times one client's training, once per round whatever the
number of clients; the demo: about 10 s a round for 800-digit clients, 2.6 s per
client; ``audit-realistic``: 1-2.5 s a round), plus the leave-one-out refits
(tiny) and two forward passes over the public images per shadow and per client.
Defences and FedProx's proximal term are not simulated.
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
from fedsim.attacks.leakage import LEAKS, LabelLeak, LeakInput, PublicData
from fedsim.attacks.toolkits.closed_form import linear_layers
from fedsim.attacks.toolkits.gradients import victim_model
from fedsim.attacks.toolkits.output_layer import check_logit_reader, public_subset
from fedsim.attacks.toolkits.shadows import RoundAnalysis, round_rng, shadow_sizes, train_shadow
from fedsim.core.params.leaks import Link, ShadowLabelsParams
from fedsim.core.threat import UPDATES

FEATURES = 4  # bias, row sum, logit shift, softmax of the logit shift


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


def fit(
    x: torch.Tensor, y: torch.Tensor, prior: torch.Tensor, ridge: float, link: Link
) -> torch.Tensor:
    """The class-symmetric weights ``(F,)`` from the pool's features ``(S * K, F)`` to its
    shares minus the prior ``(S * K,)``: ridge least squares (``linear``), or a softmax
    of ``log prior + x w`` fitted by cross-entropy on the shares (``softmax``)."""
    if link == "linear":
        penalty = ridge * len(x) * torch.eye(x.shape[1], dtype=x.dtype)
        return torch.linalg.solve(x.T @ x + penalty, x.T @ y)
    classes = len(prior)
    xs, shares = x.view(-1, classes, x.shape[1]), (y.view(-1, classes) + prior).clamp_min(0)
    weights = torch.zeros(x.shape[1], dtype=x.dtype, requires_grad=True)
    solver = torch.optim.LBFGS([weights], max_iter=100, line_search_fn="strong_wolfe")
    log_prior = prior.clamp_min(1e-12).log()

    def loss() -> torch.Tensor:
        solver.zero_grad()
        logp = (log_prior + xs @ weights).log_softmax(dim=1)
        value = -(shares * logp).sum(dim=1).mean() + ridge * weights.square().sum()
        value.backward()
        return value

    solver.step(loss)
    return weights.detach()


def predict(
    feats: torch.Tensor, weights: torch.Tensor, prior: torch.Tensor, keep: float, link: Link
) -> torch.Tensor:
    """Class shares ``(K,)`` of one update's features, ``keep`` of the fitted move away
    from the prior taken."""
    if link == "softmax":
        return (prior.clamp_min(1e-12).log() + keep * (feats @ weights)).softmax(0)
    shares = (prior + keep * (feats @ weights)).clamp_min(0)
    return shares if float(shares.sum()) > 0 else prior.clone()


def uploaded_params(shared: _Round, observation: Observation) -> dict[str, torch.Tensor]:
    """The sent parameters with the client's upload over them."""
    device = shared.sent_logits.device
    return {**shared.sent, **{n: v.to(device) for n, v in observation.shared.items()}}


@LEAKS.register("shadow-labels")
class ShadowLabels(RoundAnalysis[LabelLeak]):
    """Class counts by a ridge regression fitted on shadow clients' updates."""

    Params = ShadowLabelsParams
    params: ShadowLabelsParams
    kind = "labels"
    threat_models = UPDATES

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """What ``logit-shift`` needs: the whole model's update, an output bias, public
        images from a held-out split."""
        check_logit_reader(setting, key, "shadow-labels")

    def read_round(self, inputs: Sequence[LeakInput], seed: int) -> list[LabelLeak]:
        """One shadow pool for the round's clients (one client alone: a pool of its own)."""
        start = time.perf_counter()
        first, public = inputs[0].observation, inputs[0].public
        shared = self._shared(first, public, seed)
        prior = class_mix(public, first.input_spec.num_classes)
        sizes = [one.observation.num_examples for one in inputs]
        plains, shadow_sizes, y, offset = self._pool(first, public, shared, sizes, prior, seed)
        rows = [design(f, offset, n) for f, n in zip(plains, shadow_sizes, strict=True)]
        scale = torch.cat(rows).std(dim=0).clamp_min(1e-12)
        xs = [row / scale for row in rows]
        weights = fit(torch.cat(xs), y, prior, self.params.ridge, self.params.link)
        noise = self._noise(xs, y, prior)
        fitted = time.perf_counter() - start
        began = time.perf_counter()
        plain = [shared.features(uploaded_params(shared, one.observation)) for one in inputs]
        references = self._references(plain, offset)
        read = (time.perf_counter() - began) / len(inputs)
        leaks = []
        for one, own, reference in zip(inputs, plain, references, strict=True):
            began = time.perf_counter()
            examples = one.observation.num_examples
            feats = design(own, reference, examples) / scale
            estimate = predict(feats, weights, prior, 1.0, self.params.link)
            moved = 0.5 * float((estimate - prior).abs().sum())
            # Read as the prior where the estimate moved no further from it than the fit
            # moves an IID shadow it did not see (gate x that), fully beyond twice that.
            threshold = self.params.gate * noise
            keep = min(1.0, max(0.0, moved / threshold - 1)) if threshold > 0 else 1.0
            shares = predict(feats, weights, prior, keep, self.params.link)
            counts = shares / shares.sum() * examples
            seconds = time.perf_counter() - began + read + fitted / len(inputs)
            details = {"pool-seconds": fitted, "kept": keep, "noise-tv": noise}
            leaks.append(LabelLeak(counts.float(), seconds, details))
        return leaks

    def _noise(self, xs: list[torch.Tensor], y: torch.Tensor, prior: torch.Tensor) -> float:
        """How far from the prior the fit reads an IID shadow left out of it: the mean TV
        over the IID shadows (0 without two or more of them)."""
        iid = self._iid_at()
        if len(iid) < 2:
            return 0.0
        targets = y.view(len(xs), -1)
        moved = []
        for left in iid:
            kept = [i for i in range(len(xs)) if i != left]
            x = torch.cat([xs[i] for i in kept])
            weights = fit(x, targets[kept].flatten(), prior, self.params.ridge, self.params.link)
            estimate = predict(xs[left], weights, prior, 1.0, self.params.link)
            truth = targets[left] + prior
            moved.append(0.5 * float((estimate - truth).abs().sum()))
        return float(np.mean(moved))

    def _references(self, plain: list[torch.Tensor], offset: torch.Tensor) -> list[torch.Tensor]:
        """What each client's features are read against: with ``reference = "round"`` and
        at least ``min_round`` clients, the mean of the round's other clients (their
        mixes average out, and they trained on data the model has seen, as the client
        did: FedMIA's "all for one"); else the IID shadows' mean."""
        count = len(plain)
        if self.params.reference != "round" or count < self.params.min_round:
            return [offset] * count
        total = torch.stack(plain).sum(0)
        return [(total - own) / (count - 1) for own in plain]

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
        rng = round_rng(seed, observation.round)
        classes = len(prior)
        iid_at = self._iid_at()
        rows, targets, made = [], [], []
        for i, size in enumerate(shadow_sizes(sizes, p.shadows, p.max_examples)):
            if i in iid_at:
                idx = torch.from_numpy(rng.choice(len(public), size, replace=True))
            else:
                alpha = p.alphas[i % len(p.alphas)]
                draw = rng.multinomial(size, rng.dirichlet(np.full(classes, alpha)))
                idx = public_subset(public, np.repeat(np.arange(classes), draw), rng)
            labels = public.labels[idx]
            trained = train_shadow(
                shared.model,
                shared.sent,
                public.images[idx].to(self.device),
                labels.to(self.device),
                observation.train_config,
                int(rng.integers(2**31)),
            )
            rows.append(shared.features({**shared.sent, **trained}))
            made.append(size)
            share = torch.bincount(labels.long().cpu(), minlength=classes).double() / size
            targets.append(share - prior)
        iid_rows = [rows[i] for i in iid_at] or rows
        return rows, made, torch.cat(targets), torch.stack(iid_rows).mean(0)
