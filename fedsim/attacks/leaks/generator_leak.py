"""Class representatives read from FedCG's uploaded generator.

A FedCG client uploads its conditional generator G_i, trained (stage 2) to
reproduce the features its private extractor E_i gives its own images of each
class: G_i's class-``c`` features stand for the client's class-``c`` images in
a feature space the server cannot read directly. ``generator-representatives``
(:class:`GeneratorRepresentatives`) turns them back into images:

1. **generated features**: the mean of G_i(z, c) over ``codes`` seeded codes
   ``z ~ N(0, 1)``, for each class ``c`` the uploaded classifier's output bias
   indicates present (negative bias gradient, as ``class-representatives``);
2. **the extractor estimate E~**: E_i never leaves the client, and FedCG shares
   no global extractor. The attacker fits one on what it holds, the server's
   public labelled data: E~ (the architecture's extractor, seeded from the
   attack's stream) is trained by Adam to minimise, on public batches,
   ``CE(C_i(E~(x)), y) + feature_weight * MSE(E~(x), G_i(z, y))`` with the
   client's uploaded classifier C_i and generator G_i frozen: the client's own
   stage-1 objective with G_i in place of the global generator, so E~ maps
   public images of class ``c`` to where G_i puts class ``c``. With
   ``extractor = "random"`` E~ keeps its random initialisation (the estimate
   ``aligned-dlg`` uses), for comparison;
3. **inversion**: images ``x`` with ``E~(x)`` equal to the generated features,
   by :func:`~fedsim.attacks.toolkits.closed_form.invert_features` (Adam in pixel space
   from grey, boxed to [0, 1]).

The representatives are scored as every ``representatives`` analysis's
(:func:`~fedsim.core.leak_metrics.score_representatives`: SSIM and PSNR to the
client's class-mean image and to its nearest image of the class). The public
class-mean images set the bar a representative must clear to say anything
about the client rather than about the dataset (measured in docs/leaks.md).
It refuses a strategy that uploads no generator and the ``probe`` threat
model (it reads the real upload), and needs the held-out split for its
public data; it runs on the audit's victims only.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

from fedsim.attacks.base import AttackSetting
from fedsim.attacks.leakage import LEAKS, LeakAnalysis, LeakInput, RepresentativesLeak
from fedsim.attacks.toolkits.closed_form import Inversion, linear_layers
from fedsim.attacks.toolkits.generator import check_generator_uploaded, uploaded_generator
from fedsim.attacks.toolkits.gradients import target_gradient
from fedsim.attacks.toolkits.output_layer import check_output_layer
from fedsim.core import protocol
from fedsim.core.config import require
from fedsim.core.gan import NOISE_DIM, ConditionalGenerator
from fedsim.core.models import SplitNet, build_model
from fedsim.core.params.leaks import GeneratorRepresentativesParams
from fedsim.core.seeds import SeedStream, derive_seed
from fedsim.core.threat import ONE_UPDATE, SharedKind


@LEAKS.register("generator-representatives")
class GeneratorRepresentatives(LeakAnalysis):
    """FedCG's uploaded generator's class features, inverted through a fitted extractor."""

    Params = GeneratorRepresentativesParams
    params: GeneratorRepresentativesParams
    kind = "representatives"
    every_client = False
    threat_models = ONE_UPDATE  # the uploaded generator and classifier; a probe has none

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Refuse a strategy without a generator, the probe, and data without public images."""
        name = "generator-representatives"
        check_generator_uploaded(setting, key, name)
        check_output_layer(setting, key, name)
        require(
            setting.held_out,
            f"{key}.name",
            name,
            f"fits its extractor estimate on public data; dataset {setting.data.dataset!r} "
            "has no held-out split",
        )

    def analyse(self, inputs: LeakInput, seed: int = 0) -> RepresentativesLeak:
        """Generated features per present class, inverted to images through E~."""
        start = time.perf_counter()
        observation, device = inputs.observation, self.device
        if observation.shared_kind != SharedKind.UPDATE:
            raise ValueError("generator-representatives reads an update, not a probe gradient")
        generator = uploaded_generator(observation, device, "generator-representatives")
        model_seed = derive_seed(SeedStream.ATTACK_MODEL, seed)
        model = build_model(observation.model, observation.input_spec, seed=model_seed)
        model.to(device)
        classifier = {
            k: v for k, v in observation.shared.items() if k.startswith(protocol.CLASSIFIER)
        }
        model.load_state_dict(classifier, strict=False)  # C_i as uploaded
        output = linear_layers(model)[-1][0]
        bias = target_gradient(observation, device)[f"{output}.bias"]
        every = self.params.classes == "all"
        classes = torch.arange(len(bias), device=device) if every else torch.nonzero(bias < 0)
        classes = classes.flatten()
        gen = torch.Generator().manual_seed(derive_seed(SeedStream.ATTACK_CODES, seed))
        with torch.no_grad():
            z = torch.randn(len(classes) * self.params.codes, NOISE_DIM, generator=gen)
            wanted = classes.repeat_interleave(self.params.codes)
            generated = generator(z.to(device), wanted.to(device))
        features = generated.reshape(len(classes), self.params.codes, -1).mean(dim=1)
        loss = float("nan")
        if self.params.extractor == "fitted" and self.params.fit_steps:
            loss = self.fit(model, generator, inputs, seed)
        details: dict[str, Any] = {
            "layer": "classifier",
            "extractor": f"estimate {self.params.extractor}",
            "fit_loss": loss,
        }
        model.eval()
        tensors = {n: t.detach() for n, t in [*model.named_parameters(), *model.named_buffers()]}
        p = self.params
        inversion = Inversion(model, tensors, model.classifier, p.inversion_steps, p.inversion_lr)
        return inversion.leak(observation, classes, features, start, details)

    def fit(
        self, model: SplitNet, generator: ConditionalGenerator, inputs: LeakInput, seed: int
    ) -> float:
        """E~ fitted in place on the public data (the module's objective, C_i and G_i
        frozen); the last step's loss."""
        public, device, p = inputs.public, self.device, self.params
        if not len(public):
            raise ValueError("generator-representatives needs public data to fit its extractor")
        model.classifier.requires_grad_(False)
        optimizer = torch.optim.Adam(model.extractor.parameters(), lr=p.fit_lr)
        gen = torch.Generator().manual_seed(derive_seed(SeedStream.LEAK_ANALYSIS, seed))
        model.train()
        loss = torch.tensor(float("nan"))
        for _ in range(p.fit_steps):
            pick = torch.randint(0, len(public), (p.fit_batch_size,), generator=gen)
            x, y = public.images[pick].to(device), public.labels[pick].to(device)
            with torch.no_grad():
                z = torch.randn(len(y), NOISE_DIM, generator=gen).to(device)
                target = generator(z, y)
            features = model.extractor(x)
            loss = F.cross_entropy(model.classifier(features), y)
            loss = loss + p.feature_weight * F.mse_loss(features, target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return float(loss.detach())
