"""Which candidate records a client trained on this round, from its whole-model update.

Passive white-box membership inference on a federated update (Nasr, Shokri,
Houmansadr, S&P 2019): the server holds the model it sent and the one the
client returned, and scores each candidate record:

- ``loss-drop`` (:class:`LossDrop`): the candidate's loss at the sent model
  minus its loss at the uploaded one. Local training lowers its own examples'
  losses most.
- ``gradient-alignment`` (:class:`GradientAlignment`): the cosine between the
  candidate's gradient at the sent model and the update read as a gradient
  (Li et al., ICLR 2023; FedMIA's "gradient cosine" statistic): an update is a sum
  of its examples' gradients, so members point along it.

Those rank every candidate on one scale, yet some records are easy (any client's
training lowers their loss) and some hard. The calibrated scores read each
candidate's statistic at the client's upload against the same statistic at models
that did *not* train on it, as the one-sided Gaussian z-score ``(s - mean) / std``
(rank-equal to the papers' ``Phi`` of it):

- ``fedmia`` (:class:`FedMIA`; Zhu et al. 2024, "FedMIA: An Effective Membership
  Inference Attack Exploiting 'All for One' Principle in Federated Learning"; the
  authors' code, Liar-Mask/FedMIA): the reference models are the round's *other*
  clients' uploads, which the server holds anyway; on disjoint partitions the
  candidate is a non-member of each. No training: one forward pass of a client's
  candidates per client of the round. Where fedsim differs: one round only (the
  paper also accumulates over rounds, its "multi-temporal" part); the statistic is
  the logit-scaled confidence (the authors' code reads the logit margin) or minus
  the loss (``statistic = "loss"``: the sent model's loss is the same under every
  client, so that is loss-drop read against the round). It refuses a round of
  fewer than 2 clients; against one other client there is no spread and each
  candidate's difference is its score; a round left with one reply at run time (a
  client failed) is read against the sent model, as ``details`` say. The variance is
  pooled over the candidates by default (``variance = "global"``; the authors' code
  divides by each candidate's own): with the 3-15 other clients of fedsim's rounds
  that scored higher everywhere measured.
  In ``audit.leaks = "auto"``: above ``loss-drop`` in every setting measured.
- ``lira-offline`` (:class:`LiraOffline`; Carlini et al., S&P 2022, offline LiRA):
  the reference models are ``shadows`` shadow clients (default 8) trained from the
  sent model with the round's client config on random subsets of the server's
  public data at the round's client sizes (:mod:`fedsim.attacks.toolkits.shadows`).
  No candidate is ever in the public data, so every shadow is an OUT model for
  every candidate. The statistic is the logit-scaled confidence ``log(p / (1 - p))``
  of the true label; the variance is pooled over the candidates by default (the
  paper's advice for few shadows). Cost: ``shadows`` local trainings per round,
  once for all of the round's clients (on the demo's 800-digit clients about eight
  client trainings a round), plus a forward pass of the candidates per shadow: far
  above what ``audit.leaks = "auto"`` may add, so it is opted into by name. Where
  fedsim differs: no IN shadows (online LiRA), no augmented queries; defences and
  FedProx's proximal term are not simulated in the shadows.

All need the whole model's update (FedAvg, FedProx: ``uploads`` is ``None``)
and candidates, which need a held-out split for the non-members; the calibrated
two need each client's own upload (``audit.threat-model = "update"``). Each refuses
other settings in one line. ``loss-drop`` and ``gradient-alignment`` take any
modality (the calibrated two are checked on images only): the loss of one candidate
is its modality's (:meth:`~fedsim.core.modality.Modality.example_losses`: an image's
cross-entropy, a text window's mean next-token cross-entropy), so on a text
federation the candidates are a client's own training windows against held-out
windows of the same speaking role.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.leakage import (
    LEAKS,
    Candidates,
    LeakAnalysis,
    LeakInput,
    MembershipLeak,
)
from fedsim.attacks.toolkits.gradients import target_gradient, victim_model
from fedsim.attacks.toolkits.shadows import RoundAnalysis, round_rng, shadow_sizes, train_shadow
from fedsim.core.config import require
from fedsim.core.modality import ANY, IMAGE, Modality
from fedsim.core.modality import modality as modality_named
from fedsim.core.models import SplitNet
from fedsim.core.params.leaks import FedMIAParams, LiraOfflineParams, MembershipParams, Variance
from fedsim.core.threat import ONE_UPDATE, UPDATES, SharedKind


def check_whole_model_update(setting: AttackSetting, key: str, name: str) -> None:
    """Refuse settings without the whole model's update or without a held-out split."""
    require(
        setting.uploads is None,
        f"{key}.name",
        name,
        "scores candidates against the whole model's update; strategy "
        f"{setting.strategy!r} does not upload it",
    )
    require(
        setting.held_out,
        f"{key}.name",
        name,
        f"needs non-member candidates from a held-out split; dataset "
        f"{setting.data.dataset!r} has none",
    )


def need_candidates(inputs: LeakInput, name: str) -> Candidates:
    """The candidates, refusing an input without them (``ValueError``)."""
    if inputs.candidates is None:
        raise ValueError(f"{name} scores candidates; the input holds none")
    return inputs.candidates


class MembershipAnalysis(LeakAnalysis):
    """A per-candidate score from the sent and uploaded models."""

    Params = MembershipParams
    params: MembershipParams
    kind = "membership"
    needs_candidates = True
    threat_models = UPDATES  # a model update: one client's, or the round's mean
    modality: ClassVar[str] = ANY  # each candidate's loss is its modality's
    # The last victim model built and what it was built from (:meth:`victim`).
    _built: tuple[Observation, int, tuple[SplitNet, dict[str, torch.Tensor]]] | None = None

    @classmethod
    def registered_name(cls) -> str:
        """The name it is registered under, for its refusals and errors."""
        return LEAKS.name_of(cls)

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """The whole model's update and a held-out split, or a one-line refusal."""
        check_whole_model_update(setting, key, cls.registered_name())

    def analyse(self, inputs: LeakInput, seed: int = 0) -> MembershipLeak:
        """One score per candidate, in the candidates' order."""
        start = time.perf_counter()
        candidates = need_candidates(inputs, self.registered_name())
        observation = inputs.observation
        if observation.shared_kind != SharedKind.UPDATE or not set(
            observation.global_params
        ) <= set(observation.shared):
            raise ValueError(f"{self.registered_name()} needs the whole model's update")
        data = modality_named(observation.input_spec.modality)
        step = self.params.chunk
        scores = torch.cat(
            [
                self.score(
                    observation,
                    candidates.images[i : i + step].to(self.device),
                    candidates.labels[i : i + step].to(self.device),
                    seed,
                    data,
                )
                for i in range(0, len(candidates), step)
            ]
        )
        return MembershipLeak(scores.cpu(), time.perf_counter() - start)

    def score(
        self,
        observation: Observation,
        images: torch.Tensor,
        labels: torch.Tensor,
        seed: int,
        data: Modality,
    ) -> torch.Tensor:
        """Scores of one chunk of candidates (``data``: their modality; higher = member)."""
        raise NotImplementedError

    def victim(
        self, observation: Observation, seed: int
    ) -> tuple[SplitNet, dict[str, torch.Tensor]]:
        """:func:`victim_model` of ``observation`` (read, never written), built once for the
        chunks and clients that received the same sent model, as a round's clients all do:
        building it took about a quarter of loss-drop's time on a text federation."""
        if self._built is not None:
            seen, seen_seed, built = self._built
            sent, before = observation.global_params, seen.global_params
            if (
                seed == seen_seed
                and (observation.model, observation.input_spec, observation.shared_kind)
                == (seen.model, seen.input_spec, seen.shared_kind)
                and sent.keys() == before.keys()
                and all(sent[name] is before[name] for name in sent)
            ):
                return built
        built = victim_model(observation, self.device, seed)
        self._built = (observation, seed, built)
        return built


@LEAKS.register("loss-drop")
class LossDrop(MembershipAnalysis):
    """Loss at the sent model minus loss at the uploaded model, per candidate."""

    def score(
        self,
        observation: Observation,
        images: torch.Tensor,
        labels: torch.Tensor,
        seed: int,
        data: Modality,
    ) -> torch.Tensor:
        model, sent = self.victim(observation, seed)
        uploaded = {**sent, **{n: v.to(self.device) for n, v in observation.shared.items()}}
        with torch.no_grad():
            before = data.example_losses(
                lambda x: functional_call(model, sent, (x,)), images, labels
            )
            after = data.example_losses(
                lambda x: functional_call(model, uploaded, (x,)), images, labels
            )
        return before - after


@LEAKS.register("gradient-alignment")
class GradientAlignment(MembershipAnalysis):
    """Cosine between each candidate's gradient at the sent model and the update."""

    # Per-candidate gradients cost about half a quickstart client's own training (0.15 s
    # for 200 candidates) and scored below loss-drop where measured: opted into by name.
    in_auto = False

    def score(
        self,
        observation: Observation,
        images: torch.Tensor,
        labels: torch.Tensor,
        seed: int,
        data: Modality,
    ) -> torch.Tensor:
        model, sent = self.victim(observation, seed)
        names = list(observation.shared)
        direction = target_gradient(observation, self.device)
        flat = torch.cat([direction[n].flatten() for n in names])

        def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            forward = lambda v: functional_call(model, {**sent, **params}, (v,))  # noqa: E731
            return data.example_losses(forward, x[None], y[None])[0]

        trainable = {n: sent[n] for n in names}
        grads = vmap(grad(loss), in_dims=(None, 0, 0))(trainable, images, labels)
        per_example = torch.cat([grads[n].flatten(1) for n in names], dim=1)
        return F.cosine_similarity(per_example, flat[None], dim=1)


FLOOR = 1e-8  # added to the variance (the authors' codes add the same)


def statistic(
    model: SplitNet,
    params: dict[str, torch.Tensor],
    candidates: Candidates,
    data: Modality,
    chunk: int,
    device: torch.device,
    kind: str = "confidence",
) -> torch.Tensor:
    """``(n,)`` float64 per candidate at ``params``: the logit-scaled confidence
    ``log(p / (1 - p))`` of its label (``p = exp(-loss)``: a text window's mean
    next-token loss), or minus its loss (``kind = "loss"``)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(candidates), chunk):
            images = candidates.images[i : i + chunk].to(device)
            labels = candidates.labels[i : i + chunk].to(device)
            loss = data.example_losses(
                lambda x: functional_call(model, params, (x,)).double(), images, labels
            ).double()
            if kind == "loss":
                out.append(-loss)
            else:
                # log p - log(1 - p), stable for p near 1 (loss near 0)
                out.append(-loss - torch.log(-torch.expm1(-loss.clamp_min(1e-300))))
    return torch.cat(out).cpu()


def gaussian_z(target: torch.Tensor, reference: torch.Tensor, variance: Variance) -> torch.Tensor:
    """``(n,)``: each candidate's ``target`` statistic as a z-score of the Gaussian fitted
    to its ``reference`` statistics ``(R, n)`` (models that did not train on it):
    per-candidate mean, and per-candidate or pooled (``global``) variance."""
    mean = reference.mean(dim=0)
    spread = reference.var(dim=0, unbiased=False)
    if variance == "global":
        spread = spread.mean().expand_as(mean)
    return (target - mean) / (spread + FLOOR).sqrt()


class CalibratedMembership(RoundAnalysis[MembershipLeak], MembershipAnalysis):
    """A membership score read against reference models, a round's clients together
    (one client alone is a round of one; ``fedmia`` refuses it: it needs the others)."""

    threat_models = ONE_UPDATE  # each client's own upload (the round's mean hides it)
    # Written for any modality (the statistic is the modality's loss) but checked on
    # images only: text federations keep loss-drop and gradient-alignment.
    modality: ClassVar[str] = IMAGE


@LEAKS.register("fedmia")
class FedMIA(CalibratedMembership):
    """Each candidate at the client's upload against the round's other uploads."""

    Params = FedMIAParams  # type: ignore[assignment]
    params: FedMIAParams  # type: ignore[assignment]
    # In "auto": above loss-drop in every setting of bench/membership.py (AUC +0.017 to
    # +0.029, docs/leaks.md) at about twice its cost, no training (a forward pass of a
    # client's candidates per client of the round).

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """As ``loss-drop``, and a round of at least two clients."""
        super().check_setting(setting, key)
        count = setting.clients_per_round
        require(
            count is None or count >= 2,
            f"{key}.name",
            "fedmia",
            f"reads a client against the round's other clients; a round here has {count}",
        )

    def analyse(self, inputs: LeakInput, seed: int = 0) -> MembershipLeak:
        """Refused (``ValueError``): one client alone has no round to be read against."""
        raise ValueError(
            "fedmia reads a client against the round's other clients; "
            f"round {inputs.observation.round} gave 1"
        )

    def read_round(self, inputs: Sequence[LeakInput], seed: int) -> list[MembershipLeak]:
        """Each client against the others; a round left with one reply (a client failed)
        reads it against the sent model instead (loss-drop's reading, said in ``details``)
        rather than stopping the run."""
        start = time.perf_counter()
        first = inputs[0].observation
        data = modality_named(first.input_spec.modality)
        model, sent = self.victim(first, seed)
        uploads = [
            {**sent, **{n: v.to(self.device) for n, v in one.observation.shared.items()}}
            for one in inputs
        ]
        alone = len(inputs) < 2
        if alone:
            uploads.append(sent)
        shared = time.perf_counter() - start
        leaks = []
        p = self.params
        for k, one in enumerate(inputs):
            began = time.perf_counter()
            candidates = need_candidates(one, "fedmia")
            stats = torch.stack(
                [
                    statistic(model, params, candidates, data, p.chunk, self.device, p.statistic)
                    for params in uploads
                ]
            )
            others = torch.cat([stats[:k], stats[k + 1 :]])
            scores = gaussian_z(stats[k], others, p.variance).float()
            seconds = time.perf_counter() - began + shared / len(inputs)
            details: dict[str, object] = {"reference-clients": 0 if alone else len(others)}
            if alone:
                details["reference"] = "the sent model: the round had one reply"
            leaks.append(MembershipLeak(scores, seconds, details))
        return leaks


@LEAKS.register("lira-offline")
class LiraOffline(CalibratedMembership):
    """Each candidate's confidence at the upload against shadow clients trained without it."""

    Params = LiraOfflineParams  # type: ignore[assignment]
    params: LiraOfflineParams  # type: ignore[assignment]
    # ``shadows`` local trainings a round: about 8x one client's training, so far above
    # what "auto" may cost on the demo (docs/leaks.md): opted into by name.
    in_auto: ClassVar[bool] = False

    def read_round(self, inputs: Sequence[LeakInput], seed: int) -> list[MembershipLeak]:
        start = time.perf_counter()
        first, public = inputs[0].observation, inputs[0].public
        data = modality_named(first.input_spec.modality)
        model, sent = self.victim(first, seed)
        trainee, _ = victim_model(first, self.device, seed)
        rng = round_rng(seed, first.round)
        p = self.params
        sizes = shadow_sizes(
            [one.observation.num_examples for one in inputs], p.shadows, p.max_examples
        )
        shadows = []
        for size in sizes:
            idx = torch.from_numpy(rng.choice(len(public), size, replace=size > len(public)))
            trained = train_shadow(
                trainee,
                sent,
                public.images[idx].to(self.device),
                public.labels[idx].to(self.device),
                first.train_config,
                int(rng.integers(2**31)),
            )
            shadows.append({**sent, **trained})
        pool = time.perf_counter() - start
        leaks = []
        for one in inputs:
            began = time.perf_counter()
            candidates = need_candidates(one, "lira-offline")
            uploaded = {**sent, **{n: v.to(self.device) for n, v in one.observation.shared.items()}}
            target = statistic(model, uploaded, candidates, data, p.chunk, self.device)
            reference = torch.stack(
                [statistic(model, s, candidates, data, p.chunk, self.device) for s in shadows]
            )
            scores = gaussian_z(target, reference, p.variance).float()
            seconds = time.perf_counter() - began + pool / len(inputs)
            details = {"pool-seconds": pool, "shadows": len(shadows)}
            leaks.append(MembershipLeak(scores, seconds, details))
        return leaks
