"""``dager``: a text client's token sequences read exactly off its attention-weight gradients.

The audit attack around :func:`fedsim.text.dager.dager` (Petrov et al., NeurIPS 2024):
it rebuilds the transformer the server sent, reads layers 0 and 1's stacked q, k, v
weight gradients from the upload and returns every sequence whose layer inputs lie in
both gradients' row spans. It reads one client's upload: a probe's gradient (exact, the
paper's setting) or an update, read as one SGD step. The row-space argument holds for
any number of SGD steps only approximately: each step's gradient is taken at other
weights, so the update's row space holds every step's inputs, but layer 1's inputs
depend on layer 0's moving weights and Adam rescales each coordinate, which turns the
span of the rows into another one. It is exact for one-step SGD (FedSGD); for other
updates the record says ``one-step model: no`` and the result is what the span still
tells. Refused in one line before any work where it cannot apply
(:func:`~fedsim.attacks.toolkits.text_victim.check_text_setting`).
"""

from __future__ import annotations

import time
from typing import ClassVar

import torch

from fedsim.attacks.base import Attack, AttackSetting, Observation, Reconstruction
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.text_victim import (
    body_of,
    check_text_setting,
    first_layers_gradients,
    one_step,
    sent_model,
)
from fedsim.core.params.analytic import DagerParams
from fedsim.core.raw import TEXT
from fedsim.core.threat import ONE_CLIENT
from fedsim.text.dager import dager


@ATTACKS.register("dager")
class Dager(Attack):
    """DAGER's exact attack on a causal transformer (span check, greedy causal assembly)."""

    Params = DagerParams
    modality: ClassVar[str] = TEXT
    threat_models = ONE_CLIENT  # one client's rows: a mean's span holds every client's tokens

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        check_text_setting(setting, key, "dager")

    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        """Every sequence both layers' spans admit (none when the span fills the width)."""
        start = time.perf_counter()
        body = body_of(sent_model(observation, self.device).double())
        gradients = first_layers_gradients(observation)
        length = observation.input_spec.image_size
        result = dager(body, gradients, length, self.params)  # type: ignore[arg-type]
        stop = "span-full" if result.span_full else "prefixes-cut" if result.prefixes_cut else ""
        return Reconstruction(
            images=result.sequences,
            labels=torch.zeros(len(result.sequences), dtype=torch.long),
            objective_trace=[],
            iterations=1,
            steps_taken=1,
            converged=one_step(observation),
            seconds=time.perf_counter() - start,
            details={
                "stop_reason": stop,
                "ranks": result.ranks,
                "one_step": one_step(observation),
            },
        )
