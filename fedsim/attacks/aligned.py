"""DLG against FedCG: gradient matching plus FedCG's feature alignment (eq. 8).

Under FedCG the server receives a client's classifier C_i and its generator
G_i, never its extractor E_i. The attacker matches the classifier gradient
through a randomly initialised estimate E~ of the extractor (as against
FedSplit) and adds the alignment term

    lambda * sum_c [(mu_c(E~(x~)) - mu_c(G_i(z, y~)))^2 + (sigma_c(E~(x~)) - sigma_c(G_i(z, y~)))^2]

with mu_c, sigma_c the per-channel mean and standard deviation of features,
y~ the labels read from the last layer (labels must be inferred: G_i takes
class indices) and z fixed N(0, 1) codes. E~ stays fixed at its random
initialisation: optimising it jointly with x~ is not implemented.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.func import functional_call

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import Observation
from fedsim.attacks.dlg import DLG, DLGParams
from fedsim.attacks.matching import _Group
from fedsim.core.config import require
from fedsim.core.gan import NOISE_DIM, build_generator
from fedsim.core.seeds import SeedStream, derive_seed

GENERATOR_PREFIX = "generator."
EXTRACTOR_PREFIX = "extractor."


@dataclass(frozen=True)
class AlignedDLGParams(DLGParams):
    """DLG's settings plus the alignment weight lambda; labels are inferred."""

    alignment_weight: float = 1.0
    codes: int = 64
    labels: Literal["joint", "infer"] = "infer"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.alignment_weight >= 0, "alignment-weight", self.alignment_weight, "must be >= 0"
        )
        require(self.codes >= 1, "codes", self.codes, "must be >= 1")
        require(
            self.labels == "infer", "labels", self.labels, "must be 'infer' (G_i needs classes)"
        )


def _channel_stats(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation over batch and space."""
    flat = features.transpose(0, 1).flatten(1)
    return flat.mean(dim=1), flat.std(dim=1, unbiased=False)


@ATTACKS.register("aligned-dlg")
class AlignedDLG(DLG):
    """DLG with FedCG's feature-alignment term against the uploaded generator."""

    Params = AlignedDLGParams
    params: AlignedDLGParams

    def _generator_stats(
        self, observation: Observation, labels: torch.Tensor, seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        uploads = observation.extras.get("uploads", {})
        state = {
            k[len(GENERATOR_PREFIX) :]: v
            for k, v in uploads.items()
            if k.startswith(GENERATOR_PREFIX)
        }
        if not state:
            raise ValueError(
                "aligned-dlg needs the client's generator (FedCG uploads 'generator.*'); "
                f"this observation from strategy {observation.strategy!r} has none"
            )
        # Every generator weight is then loaded: the build seed does not matter.
        model_seed = derive_seed(SeedStream.ATTACK_MODEL, seed)
        generator = build_generator(observation.model, observation.input_spec, model_seed)
        generator.load_state_dict(state)
        generator.to(self.device).eval()
        gen = torch.Generator().manual_seed(derive_seed(SeedStream.ATTACK_CODES, seed))
        classes = labels.repeat_interleave(-(-self.params.codes // len(labels)))
        z = torch.randn(len(classes), NOISE_DIM, generator=gen).to(self.device)
        with torch.no_grad():
            return _channel_stats(generator(z, classes.to(self.device)))

    def _build_group(self, observations: Sequence[Observation], seed: int) -> _Group:
        group = super()._build_group(observations, seed)
        assert group.labels is not None  # Params forces inferred labels
        stats = [
            self._generator_stats(obs, group.labels[v].argmax(dim=-1), seed)
            for v, obs in enumerate(observations)
        ]
        means = torch.stack([m for m, _ in stats])
        stds = torch.stack([s for _, s in stats])
        return dataclasses.replace(group, constants=[*group.constants, means, stds])

    def _problem_distance(self, group: _Group, transform: bool) -> Any:
        base_group = dataclasses.replace(group, constants=group.constants[:-2])
        matching = super()._problem_distance(base_group, transform)
        extractor = group.model.extractor
        weight = self.params.alignment_weight

        def problem(params, target, constants, x, y):
            *rest, mean, std = constants
            local = {
                k[len(EXTRACTOR_PREFIX) :]: v
                for k, v in params.items()
                if k.startswith(EXTRACTOR_PREFIX)
            }
            dummy_mean, dummy_std = _channel_stats(functional_call(extractor, local, (x,)))
            alignment = (dummy_mean - mean).square().sum() + (dummy_std - std).square().sum()
            return matching(params, target, rest, x, y) + weight * alignment

        return problem
