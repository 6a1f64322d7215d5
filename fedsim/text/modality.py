"""The ``text`` modality: token-id windows, next-token cross-entropy and accuracy."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.core.data import DatasetBundle, Normalization
from fedsim.core.modality import MODALITIES, TEXT, Modality
from fedsim.core.models import InputSpec


def next_token_logits(model: nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """``(B, T, V)``: the model's logits for each next token of ``windows`` ``(B, T + 1)``."""
    return model(windows[:, :-1])


class TextModality(Modality):
    """Windows ``(N, T + 1)`` of int64 token ids; a model maps ``(B, T)`` to ``(B, T, V)``.

    The objective is the mean next-token cross-entropy over every position (LEAF
    scores the last position only); accuracy and loss are per predicted token, so
    the perplexity is ``exp(loss)``. Labels (the windows' groups) are not read.
    """

    name = TEXT
    perplexity = True

    def takes(self, inputs: torch.Tensor) -> bool:
        return not inputs.is_floating_point() and inputs.dim() == 2

    def input_spec(self, bundle: DatasetBundle) -> InputSpec:
        length = int(bundle.train_images.shape[1]) - 1
        return InputSpec(1, length, bundle.num_classes, modality=TEXT)

    def dry_input(self, spec: InputSpec) -> torch.Tensor:
        return torch.zeros(1, spec.image_size, dtype=torch.long)

    def truth(self, bundle: DatasetBundle, inputs: torch.Tensor) -> torch.Tensor:
        """The token ids, as they are."""
        return inputs

    def model_input(self, normalization: Normalization, truth: torch.Tensor) -> torch.Tensor:
        """Token ids are model input as they are."""
        return truth.long()

    def loss(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = next_token_logits(model, inputs)
        return F.cross_entropy(logits.flatten(0, 1), inputs[:, 1:].flatten())

    def example_losses(
        self,
        forward: Callable[[torch.Tensor], torch.Tensor],
        inputs: torch.Tensor,
        labels: torch.Tensor,
    ) -> torch.Tensor:
        """Each window's mean next-token cross-entropy (every window has ``T`` targets)."""
        logits, targets = forward(inputs[:, :-1]), inputs[:, 1:]
        losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        return losses.view(targets.shape).mean(dim=1)

    def scores(
        self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, int, int]:
        logits, targets = next_token_logits(model, inputs), inputs[:, 1:]
        loss = float(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum"))
        return loss, int((logits.argmax(dim=-1) == targets).sum()), targets.numel()


MODALITIES.register(TEXT, "token sequences: next-token prediction")(TextModality())
