"""One representative per class a client holds, inverted from its uploaded model.

The passive model inversion of Fredrikson et al. (CCS 2015): an image the
model assigns to class ``c`` with high confidence, found by gradient descent
on the image, regularised by a prior from the server's public data in the
spirit of Zhang et al. (CVPR 2020), without their GAN: the image starts at the
public class-mean image and is held near it.

``model-inversion`` (:class:`ModelInversion`) rebuilds the client's model from
what the server observes (the sent global parameters with the upload applied)
and, for each class whose output bias the update raised (negative bias
gradient, as ``class-representatives``), minimises over images ``x`` in [0, 1],
all classes in one batch (Adam in pixel space, boxed):

``CE(f_u(x), c) - differential * (log p_u(c|x) - log p_g(c|x))
+ prior_weight * mean (x - m_c)^2 + tv_weight * TV(x)``

with ``f_u`` the uploaded model, ``f_g`` the sent one and ``m_c`` the public
class-mean image. The differential term asks what the client's model believes
about ``c`` beyond the global model: without it, the inversion returns what
any model of the dataset holds of ``c``. The representatives are scored as
every ``representatives`` analysis's, beside the public class-mean images (the
bar a representative must clear to say anything about the client rather than
the dataset; measured in docs/leaks.md). It needs the whole model's update
(the logits need every layer) and public images; it runs on the audit's
victims only, and is the representatives analysis ``audit.leaks = "auto"`` runs
(above ``class-representatives`` in the last round of both ``quickstart`` and
``audit-realistic``, at a fifth of its cost; both below the public bar).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedsim.attacks.base import AttackSetting
from fedsim.attacks.leakage import LEAKS, LeakAnalysis, LeakInput, RepresentativesLeak
from fedsim.attacks.toolkits.closed_form import linear_layers
from fedsim.attacks.toolkits.gradients import target_gradient, victim_model
from fedsim.attacks.toolkits.optim import BatchedAdamW
from fedsim.attacks.toolkits.output_layer import check_logit_reader, public_class_means
from fedsim.core.params.leaks import ModelInversionParams
from fedsim.core.seeds import SeedStream, derive_seed
from fedsim.core.threat import UPDATES


def row_total_variation(x: torch.Tensor) -> torch.Tensor:
    """Each image's mean absolute difference of neighbouring pixels, across and down."""
    across = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(dim=1)
    down = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(dim=1)
    return across + down


@LEAKS.register("model-inversion")
class ModelInversion(LeakAnalysis):
    """Images the uploaded model, beyond the sent one, assigns to each present class."""

    Params = ModelInversionParams
    params: ModelInversionParams
    kind = "representatives"
    every_client = False
    threat_models = UPDATES  # an uploaded model to invert: a probe has none
    # Above it in the last round of quickstart and audit-realistic at a fifth of the cost
    # (docs/leaks.md); behind a private extractor or under a probe it still runs.
    supersedes = ("class-representatives",)

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Refuse a setting without an uploaded output bias, a partial upload (a private
        extractor: no client model to invert), and data without public images."""
        use = "starts from the public class-mean images and scores beside them"
        check_logit_reader(setting, key, "model-inversion", use)

    def analyse(self, inputs: LeakInput, seed: int = 0) -> RepresentativesLeak:
        """An image per present class, optimised against the uploaded model."""
        start = time.perf_counter()
        observation, device, p = inputs.observation, self.device, self.params
        if not observation.is_update:
            raise ValueError("model-inversion reads an uploaded model, not a probe gradient")
        if not len(inputs.public):
            raise ValueError("model-inversion needs public data for its prior")
        model, sent = victim_model(observation, device, seed)
        uploaded = {**sent, **{n: v.to(device) for n, v in observation.shared.items()}}
        name, _ = linear_layers(model)[-1]
        classes = torch.nonzero(target_gradient(observation, device)[f"{name}.bias"] < 0)
        classes = classes.flatten()
        norm = observation.normalization
        prior = public_class_means(inputs.public, classes, norm).to(device)
        shape = prior.shape[1:]
        flat = prior.flatten(1)
        gen = torch.Generator().manual_seed(derive_seed(SeedStream.LEAK_ANALYSIS, seed))
        noise = torch.randn(flat.shape, generator=gen).to(device) * p.jitter
        z = (flat + noise).clamp(0, 1)

        def objective(z: torch.Tensor, live: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            z = z.detach().requires_grad_(True)
            pixels = z.reshape(-1, *shape)
            x, wanted = norm.to_model(pixels), classes[live]
            own = F.log_softmax(functional_call(model, uploaded, (x,)), dim=1)
            value = -own.gather(1, wanted[:, None]).squeeze(1)
            if p.differential:
                sent_view = F.log_softmax(functional_call(model, sent, (x,)), dim=1)
                value = value - p.differential * (
                    -value - sent_view.gather(1, wanted[:, None]).squeeze(1)
                )
            value = value + p.prior_weight * (z - flat[live]).square().mean(dim=1)
            value = value + p.tv_weight * row_total_variation(pixels)
            (grad,) = torch.autograd.grad(value.sum(), z)
            return value.detach(), grad

        if p.steps and len(classes):
            box = (
                torch.zeros(flat.shape[1], device=device),
                torch.ones(flat.shape[1], device=device),
            )
            optimizer = BatchedAdamW(z, box, lr=p.lr, weight_decay=0.0)
            for _ in range(p.steps):
                optimizer.step(objective)
            z = optimizer.z.detach()
        images = z.reshape(-1, *shape).cpu().clamp(0, 1)
        details: dict[str, Any] = {"steps": p.steps}
        # No feature is read before the inversion: an empty row per class.
        features = torch.empty(len(classes), 0)
        seconds = time.perf_counter() - start
        return RepresentativesLeak(
            classes.cpu(), images, features, True, seconds, details, prior.cpu()
        )
