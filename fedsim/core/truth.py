"""Ground truth: what a victim really trained on. It reaches the scorer, never an attack.

:class:`GroundTruth` is the one type for it. The privacy audit gets it from a
:class:`TruthSource` that the harness hands over (the harness knows the
clients; the auditor does not), and ``fedsim attack`` from the batch it
probes itself. :func:`probe_gradient` is the one way to compute the gradient
of a batch that a probed client would share.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from flwr.app import ArrayRecord
from torch import nn

from fedsim.core.config import ClientConfig
from fedsim.core.modality import of_inputs


@dataclass(frozen=True)
class GroundTruth:
    """The victim's batch: images in pixel space [0, 1] (token-id windows for text) and their
    labels."""

    images: torch.Tensor
    labels: torch.Tensor


class TruthSource(Protocol):
    """Answers, for the scorer only, what a client trained on or would be probed with."""

    def update_batch(self, partition: int, server_round: int, config: ClientConfig) -> GroundTruth:
        """The examples client ``partition`` trained on in ``server_round``."""
        ...

    def probe(
        self,
        partition: int,
        server_round: int,
        config: ClientConfig,
        sent: ArrayRecord,
        batch_size: int,
    ) -> tuple[dict[str, torch.Tensor], GroundTruth]:
        """One batch's gradient at the model the client received, as the client
        would share it (defences applied), and that batch."""
        ...

    def layer_inputs(
        self,
        partition: int,
        server_round: int,
        config: ClientConfig,
        sent: ArrayRecord,
        layer: str,
        probed: int | None = None,
    ) -> torch.Tensor:
        """The input of module ``layer`` of the client's own model (its private layers
        included) for each example of :meth:`update_batch` (its first ``probed``: the
        batch :meth:`probe` takes), one flattened row each."""
        ...


def probe_gradient(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, names: Iterable[str]
) -> dict[str, torch.Tensor]:
    """Gradient of the mean cross-entropy on ``(inputs, labels)`` w.r.t. parameters ``names``
    (next-token for token sequences: the batch's modality's objective).

    The model runs in eval mode (restored after). Parameters outside the loss
    (FedCG's generator) get no entry.
    """
    params = dict(model.named_parameters())
    wanted = [n for n in names if n in params]
    was_training = model.training
    model.eval()
    try:
        loss = of_inputs(inputs).loss(model, inputs, labels)
        grads = torch.autograd.grad(loss, [params[n] for n in wanted], allow_unused=True)
    finally:
        model.train(was_training)
    return {n: g.detach() for n, g in zip(wanted, grads, strict=True) if g is not None}
