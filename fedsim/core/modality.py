"""The modality seam: what differs between images and token sequences.

A :class:`Modality` says, for one kind of data, how a batch is recognised
(:meth:`Modality.takes`), what a model of it is built for
(:meth:`Modality.input_spec`), what one example looks like for a shapes-only
check (:meth:`Modality.dry_input`), the objective and its scores
(:meth:`Modality.loss`, :meth:`Modality.scores`, per example
:meth:`Modality.example_losses`, which membership analyses read) and what the
scorer compares (:meth:`Modality.truth`, back to model input
:meth:`Modality.model_input`). Local training, evaluation and
validation ask the modality instead of assuming pixels, so a new kind of data is
a new folder registering one (``fedsim.text`` registers ``text``), not a branch
in each of them.

Every dataset and model knows its modality: a ``modality`` attribute on the
loader or builder registered by name (``image`` when it has none), which
:func:`modality_of` reads without building anything. Pairing a component of one
modality with data of another is refused in one line before any work
(:mod:`fedsim.scenario.modality`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.core.data import DatasetBundle, Normalization
from fedsim.core.models import InputSpec
from fedsim.core.raw import ANY, IMAGE, TEXT
from fedsim.core.registry import Registry

__all__ = [
    "ANY",
    "IMAGE",
    "MODALITIES",
    "TEXT",
    "ImageModality",
    "Modality",
    "input_spec",
    "modality",
    "modality_of",
    "of_inputs",
]


class Modality(ABC):
    """One kind of data: its batches, its model inputs, its objective and scores."""

    name: ClassVar[str]
    perplexity: ClassVar[bool] = False
    """Whether the server reports ``exp(test loss)`` beside the accuracy (token prediction)."""

    @abstractmethod
    def takes(self, inputs: torch.Tensor) -> bool:
        """Whether ``inputs`` (a batch as a client holds it) is of this modality."""

    @abstractmethod
    def input_spec(self, bundle: DatasetBundle) -> InputSpec:
        """What a model of ``bundle``'s data is built for."""

    @abstractmethod
    def dry_input(self, spec: InputSpec) -> torch.Tensor:
        """One example of ``spec``'s shape (on the current default device)."""

    @abstractmethod
    def truth(self, bundle: DatasetBundle, inputs: torch.Tensor) -> torch.Tensor:
        """``inputs`` of ``bundle`` as the scorer compares them with what an attack found."""

    @abstractmethod
    def model_input(self, normalization: Normalization, truth: torch.Tensor) -> torch.Tensor:
        """Examples as :meth:`truth` gives them, back in model-input space."""

    @abstractmethod
    def loss(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training objective on one batch (a mean)."""

    @abstractmethod
    def example_losses(
        self,
        forward: Callable[[torch.Tensor], torch.Tensor],
        inputs: torch.Tensor,
        labels: torch.Tensor,
    ) -> torch.Tensor:
        """``(N,)``: the objective of each example of ``inputs`` under ``forward`` (a model,
        or a functional call of one); their mean is :meth:`loss`."""

    @abstractmethod
    def scores(
        self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, int, int]:
        """The summed loss, the correct predictions and the predictions made on one batch."""


class ImageModality(Modality):
    """Images ``(N, C, H, W)`` (or feature vectors ``(N, F, 1, 1)``) and one label each."""

    name = IMAGE

    def takes(self, inputs: torch.Tensor) -> bool:
        return inputs.is_floating_point()

    def input_spec(self, bundle: DatasetBundle) -> InputSpec:
        return InputSpec(bundle.channels, bundle.image_size, bundle.num_classes)

    def dry_input(self, spec: InputSpec) -> torch.Tensor:
        return torch.zeros(1, spec.channels, spec.image_size, spec.image_size)

    def truth(self, bundle: DatasetBundle, inputs: torch.Tensor) -> torch.Tensor:
        """Pixels in [0, 1] (the public normalisation undone)."""
        return bundle.normalization.to_pixels(inputs).clamp(0, 1)

    def model_input(self, normalization: Normalization, truth: torch.Tensor) -> torch.Tensor:
        return normalization.to_model(truth.float())

    def loss(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(inputs), labels)

    def example_losses(
        self,
        forward: Callable[[torch.Tensor], torch.Tensor],
        inputs: torch.Tensor,
        labels: torch.Tensor,
    ) -> torch.Tensor:
        return F.cross_entropy(forward(inputs), labels, reduction="none")

    def scores(
        self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, int, int]:
        logits = model(inputs)
        loss = float(F.cross_entropy(logits, labels, reduction="sum"))
        return loss, int((logits.argmax(dim=1) == labels).sum()), len(labels)


MODALITIES: Registry[Modality] = Registry("modality", ("fedsim.text",))
MODALITIES.register(IMAGE, "images (or feature vectors) with one label each")(ImageModality())


def modality(name: str) -> Modality:
    """The modality called ``name``."""
    return MODALITIES.get(name)


def modality_of(component: Any, default: str = IMAGE) -> str:
    """The modality a registered loader, builder or class declares (``default`` if none)."""
    return str(getattr(component, "modality", default))


def of_inputs(inputs: torch.Tensor) -> Modality:
    """The modality a batch ``inputs`` belongs to."""
    for name in MODALITIES.names():
        found = MODALITIES.get(name)
        if found.takes(inputs):
            return found
    raise ValueError(f"no modality takes inputs of dtype {inputs.dtype}")


def input_spec(bundle: DatasetBundle) -> InputSpec:
    """What a model of ``bundle``'s data is built for, by the bundle's modality."""
    return modality(bundle.modality).input_spec(bundle)
