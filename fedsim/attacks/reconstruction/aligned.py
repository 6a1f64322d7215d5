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

import torch
from torch.func import functional_call

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.dlg_matching import DLGMatching
from fedsim.attacks.toolkits.generator import check_generator_uploaded, uploaded_generator
from fedsim.attacks.toolkits.matching_problem import MatchingProblem
from fedsim.core import protocol
from fedsim.core.gan import NOISE_DIM
from fedsim.core.params.matching import AlignedDLGParams
from fedsim.core.seeds import SeedStream, derive_seed


def _channel_stats(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation over batch and space."""
    flat = features.transpose(0, 1).flatten(1)
    return flat.mean(dim=1), flat.std(dim=1, unbiased=False)


@ATTACKS.register("aligned-dlg")
class AlignedDLG(DLGMatching):
    """DLG with FedCG's feature-alignment term against the uploaded generator."""

    Params = AlignedDLGParams
    params: AlignedDLGParams

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        check_generator_uploaded(setting, key, "aligned-dlg")

    def victim_extras(
        self, observation: Observation, labels: torch.Tensor | None, seed: int
    ) -> dict[str, torch.Tensor]:
        """Per-channel mean and std of the uploaded generator's features for the inferred labels."""
        assert labels is not None  # Params forces inferred labels
        generator = uploaded_generator(observation, self.device, "aligned-dlg")
        gen = torch.Generator().manual_seed(derive_seed(SeedStream.ATTACK_CODES, seed))
        classes = labels.repeat_interleave(-(-self.params.codes // len(labels)))
        z = torch.randn(len(classes), NOISE_DIM, generator=gen).to(self.device)
        with torch.no_grad():
            mean, std = _channel_stats(generator(z, classes.to(self.device)))
        return {"feature-mean": mean, "feature-std": std}

    def extra_objective(
        self,
        problem: MatchingProblem,
        params: dict[str, torch.Tensor],
        extras: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> torch.Tensor:
        """``lambda * sum_c (mu_c - mu~_c)^2 + (sigma_c - sigma~_c)^2`` through E~."""
        local = {
            k[len(protocol.EXTRACTOR) :]: v
            for k, v in params.items()
            if k.startswith(protocol.EXTRACTOR)
        }
        mean, std = _channel_stats(functional_call(problem.model.extractor, local, (x,)))
        alignment = (mean - extras["feature-mean"]).square().sum()
        alignment = alignment + (std - extras["feature-std"]).square().sum()
        return self.params.alignment_weight * alignment
