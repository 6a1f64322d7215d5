"""How many examples of each class a client trained on, read from its upload.

The output layer ``logits = W h + b`` carries the class mix: its bias gradient
is ``mean_n (p_nc - y_nc)`` and each weight row's gradient ``mean_n (p_nc -
y_nc) h_n``, so with non-negative features ``h`` (after a Sigmoid or ReLU) a
class's row sum goes negative as its examples outweigh its softmax mass
(Wainakh et al., "User-Level Label Leakage from Gradients in Federated
Learning", PETS 2022, properties 1 and 2). Three analyses read it:

- ``llg`` (:class:`LLG`): LLG and LLG+ of Wainakh et al. on the row sums of
  the update read as one large-batch gradient
  (:func:`~fedsim.attacks.toolkits.gradients.target_gradient`). LLG calibrates on the
  observation alone; LLG+ subtracts a per-class offset and takes the impact of
  one example from gradients of single-class batches of the server's public
  data at the sent model (the paper's auxiliary set: here
  :attr:`~fedsim.attacks.leakage.LeakInput.public`). LLG is the default
  (0.01-0.05 s per client): the best reading of plain SGD updates measured
  here; LLG+ (20 single-class gradients, 0.5-2.6 s per client at load 10) was
  no better on a trained model (docs/leaks.md).
- ``logit-shift`` (:class:`LogitShift`): a calibrated reading that handles
  Adam, where every present class's row sum saturates near one value. The
  uploaded model has adapted to its client's class prior: on the server's
  public images its logits minus the sent model's estimate ``log pi_c`` up to
  a constant (label-shift estimation: a classifier trained under prior
  ``pi`` scores ``log p(x|c) + log pi_c``); the shares are the softmax of the
  mean logit shift. Two forward passes over the public data (0.2-0.4 s per
  client at load 10). The reading for Adam clients; under plain SGD the
  model moves too little and LLG is better.
- ``gradient-count`` (:class:`GradientCount`): today's one-step readers
  (bias-corrected counting, iLRG; :mod:`fedsim.attacks.toolkits.labels`) for a probe or
  one plain SGD step, where the update is the gradient exactly.

A calibrated reading by shadow updates lives in :mod:`fedsim.attacks.leaks.shadow_labels`
(``shadow-labels``): a regression fitted per round on the server's simulated clients,
which reads an uninformative update as the data-free prior (docs/leaks.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.leakage import LEAKS, LabelLeak, Leak, LeakAnalysis, LeakInput, PublicData
from fedsim.attacks.toolkits.closed_form import (
    exact_gradient,
    linear_layers,
    setting_batch,
)
from fedsim.attacks.toolkits.gradients import batch_gradient, victim_model
from fedsim.attacks.toolkits.labels import (
    infer_labels,
    label_method,
    last_layer_gradient,
)
from fedsim.attacks.toolkits.output_layer import (
    check_logit_reader,
    check_output_layer,
    public_subset,
)
from fedsim.core.params.leaks import GradientCountParams, LLGParams, LogitShiftParams
from fedsim.core.seeds import SeedStream, derive_seed
from fedsim.core.threat import UPDATES


def llg_counts(
    row_sums: torch.Tensor, total: int, impact: float, offset: torch.Tensor | None = None
) -> torch.Tensor:
    """LLG's greedy count: ``(K,)`` float counts summing to ``total``.

    Every class whose (offset-corrected) row sum is negative gets one example
    (the most negative first when there are more such classes than
    ``total``); then, ``total`` times, the most negative class gets one more.
    Each example given adds ``-impact`` (``impact < 0``: one example's share
    of a row sum) to its class, as the paper's code does.
    """
    sums = row_sums.double().clone()
    if offset is not None:
        sums = sums - offset.double()
    counts = torch.zeros_like(sums)
    negative = torch.argsort(sums)[: min(int((sums < 0).sum()), total)]
    counts[negative] = 1
    sums[negative] -= impact
    left = total - int(counts.sum())
    if left > 0:
        counts += _greedy_picks(sums, left, -impact)
    return counts.float()


def _greedy_picks(sums: torch.Tensor, picks: int, step: float) -> torch.Tensor:
    """How often each class is picked when, ``picks`` times, the smallest of ``sums``
    (the first on ties) is picked and raised by ``step``; without the loop, which took
    most of a client's label analysis: with ``step > 0`` the picks are the ``picks``
    smallest of every class's values ``sums + k * step``, ordered by (value, class)."""
    classes = len(sums)
    if step <= 0:  # the picked class stays the smallest
        counts = torch.zeros_like(sums)
        counts[int(torch.argmin(sums))] = picks
        return counts
    values = sums[:, None] + step * torch.arange(picks, dtype=sums.dtype)[None, :]
    owner = np.repeat(np.arange(classes), picks)
    first = np.lexsort((owner, values.flatten().cpu().numpy()))[:picks]
    return torch.from_numpy(np.bincount(owner[first], minlength=classes)).to(sums)


def output_row_sums(observation: Observation, device: torch.device) -> torch.Tensor:
    """The output layer's weight-gradient row sums (``dL/dtheta`` orientation), ``(K,)``."""
    weight, _ = last_layer_gradient(observation, device)
    return weight.sum(dim=1)


@LEAKS.register("llg")
class LLG(LeakAnalysis):
    """LLG / LLG+ (Wainakh et al., PETS 2022) on the output layer's row sums."""

    Params = LLGParams
    params: LLGParams
    kind = "labels"

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Refuse a model without an output bias or a strategy that never uploads it."""
        check_output_layer(setting, key, "llg")

    def calibration(
        self, observation: Observation, public: PublicData, seed: int
    ) -> tuple[float, torch.Tensor]:
        """LLG+'s impact of one example and per-class offset, from public single-class
        batches' gradients at the sent model."""
        model, params = victim_model(observation, self.device, seed)
        name = f"{linear_layers(model)[-1][0]}.weight"
        classes = observation.input_spec.num_classes
        rng = np.random.default_rng(derive_seed(SeedStream.LEAK_ANALYSIS, seed))
        batch = self.params.calibration_batch
        impacts, offsets = [], torch.zeros(classes, dtype=torch.float64)
        for _ in range(self.params.calibration_repeats):
            for cls in range(classes):
                idx = public_subset(public, np.full(batch, cls), rng)
                x = public.images[idx].to(self.device)
                y = public.labels[idx].to(self.device)
                (grad,) = batch_gradient(model, params, x, y, [name], create_graph=False)
                sums = grad.sum(dim=1).double().cpu()
                impacts.append(float(sums[cls]))
                offsets += sums
                offsets[cls] -= sums[cls]
        repeats = self.params.calibration_repeats
        # Mean-reduced loss: a pure batch's row sum is one example's impact.
        impact = float(np.mean(impacts)) * (1 + 1 / classes)
        return impact, offsets / (repeats * (classes - 1))

    def analyse(self, inputs: LeakInput, seed: int = 0) -> LabelLeak:
        """Class counts by LLG's greedy rule."""
        start = time.perf_counter()
        observation = inputs.observation
        sums = output_row_sums(observation, self.device).cpu()
        total = observation.num_examples
        offset = None
        if self.params.variant == "llg":
            impact = float(sums.clamp(max=0).sum()) / max(total, 1) * (1 + 1 / len(sums))
        else:
            impact, offset = self.calibration(observation, inputs.public, seed)
            # The gradient of the mean loss: B examples share the row sums.
            impact /= max(total, 1)
        counts = llg_counts(sums, total, impact, offset)
        details: dict[str, Any] = {"variant": self.params.variant, "impact": impact}
        return LabelLeak(counts, time.perf_counter() - start, details)


@LEAKS.register("logit-shift")
class LogitShift(LeakAnalysis):
    """Class shares from how the uploaded model's logits moved on public images."""

    Params = LogitShiftParams
    params: LogitShiftParams
    kind = "labels"
    threat_models = UPDATES  # an updated model's logits: a probe has none

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Refuse an update without the whole model (the logits need every layer), a
        probe (no updated model), a model whose output bias is never uploaded, and data
        without a held-out split (no public images that are not a client's)."""
        check_logit_reader(setting, key, "logit-shift")

    def analyse(self, inputs: LeakInput, seed: int = 0) -> LabelLeak:
        """Counts from the softmax of the mean logit shift over the public images."""
        return self._analyse(inputs, seed, {})

    def analyse_many(self, inputs: Sequence[LeakInput], seed: int = 0) -> list[Leak]:
        """A round's clients share the sent model: its mean logits are computed once."""
        sent_means: dict[int, torch.Tensor] = {}
        return [self._analyse(one, seed, sent_means) for one in inputs]

    def _analyse(
        self, inputs: LeakInput, seed: int, sent_means: dict[int, torch.Tensor]
    ) -> LabelLeak:
        start = time.perf_counter()
        observation = inputs.observation
        model, sent = victim_model(observation, self.device, seed)
        uploaded_model = {**sent, **{n: v.to(self.device) for n, v in observation.shared.items()}}
        images = inputs.public.images.to(self.device)
        with torch.no_grad():
            if observation.round not in sent_means:
                sent_means[observation.round] = functional_call(model, sent, (images,)).mean(0)
            uploaded = functional_call(model, uploaded_model, (images,)).mean(dim=0)
            shift = uploaded - sent_means[observation.round]
        logits = self.params.temperature * shift.double().cpu()
        if self.params.support == "negative-rows":
            present = output_row_sums(observation, self.device).cpu() < 0
            if bool(present.any()):
                logits = logits.masked_fill(~present, -torch.inf)
        counts = logits.softmax(dim=0) * observation.num_examples
        details: dict[str, Any] = {"shift": shift.cpu()}
        return LabelLeak(counts.float(), time.perf_counter() - start, details)


@LEAKS.register("gradient-count")
class GradientCount(LeakAnalysis):
    """The one-step label readers (iDLG, counting, iLRG) as a labels analysis."""

    Params = GradientCountParams
    params: GradientCountParams
    kind = "labels"

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Refuse audits without an exact gradient (several steps, Adam, momentum) and
        models whose server never sees the output bias."""
        check_output_layer(setting, key, "gradient-count")
        setting_batch(setting, "gradient-count", key)

    def analyse(self, inputs: LeakInput, seed: int = 0) -> LabelLeak:
        """The readers' labels as counts per class."""
        start = time.perf_counter()
        observation = inputs.observation
        exact_gradient(observation, "gradient-count")  # refuses an inexact upload
        labels = infer_labels(observation, self.device, self.params.batch_labels).cpu()
        counts = torch.bincount(labels, minlength=observation.input_spec.num_classes).float()
        details = {"method": label_method(observation, self.params.batch_labels)}
        return LabelLeak(counts, time.perf_counter() - start, details)
