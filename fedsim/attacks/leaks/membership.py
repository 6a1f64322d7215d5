"""Which candidate records a client trained on this round, from its whole-model update.

Passive white-box membership inference on a federated update (Nasr, Shokri,
Houmansadr, S&P 2019): the server holds the model it sent and the one the
client returned, and scores each candidate record:

- ``loss-drop`` (:class:`LossDrop`): the candidate's loss at the sent model
  minus its loss at the uploaded one. Local training lowers its own examples'
  losses most.
- ``gradient-alignment`` (:class:`GradientAlignment`): the cosine between the
  candidate's gradient at the sent model and the update read as a gradient
  (Li et al., ICLR 2023): an update is a sum of its examples' gradients, so
  members point along it.

Both need the whole model's update (FedAvg, FedProx: ``uploads`` is ``None``)
and candidates, which need a held-out split for the non-members; each refuses
other settings in one line. Both take any modality: the loss of one candidate is
its modality's (:meth:`~fedsim.core.modality.Modality.example_losses`: an image's
cross-entropy, a text window's mean next-token cross-entropy), so on a text
federation the candidates are a client's own training windows against held-out
windows of the same speaking role. A calibrated score (LiRA-style shadow updates on
public data, Carlini et al. 2022) is not implemented: it would cost one client
training per shadow.
"""

from __future__ import annotations

import time
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.leakage import LEAKS, Candidates, LeakAnalysis, LeakInput, MembershipLeak
from fedsim.attacks.toolkits.gradients import target_gradient, victim_model
from fedsim.core.config import require
from fedsim.core.modality import ANY, Modality
from fedsim.core.modality import modality as modality_named
from fedsim.core.models import SplitNet
from fedsim.core.params.leaks import MembershipParams
from fedsim.core.threat import UPDATES, SharedKind


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
