"""The hyper-parameters every gradient-matching attack takes (:class:`MatchingParams`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from fedsim.attacks.base import require_restarts
from fedsim.attacks.toolkits.convergence import ConvergenceRule
from fedsim.attacks.toolkits.gradients import (
    BatchNormKnowledge,
)
from fedsim.attacks.toolkits.labels import BatchLabels, require_inferred
from fedsim.core.config import require

OptimizerName = Literal["lbfgs", "adamw"]
DEFAULT_LR: dict[str, float] = {"lbfgs": 1.0, "adamw": 1e-3}


@dataclass(frozen=True)
class MatchingParams:
    """Hyper-parameters every gradient-matching attack takes.

    Attributes
    ----------
    restarts:
        Dummy initialisations per victim; the one with the lowest final
        gradient distance is kept (a single run often diverges or stalls).
    steps:
        Optimiser steps; ``None`` takes the paper's count for ``optimizer``.
    optimizer:
        ``lbfgs`` (PyTorch's defaults, no line search) or ``adamw``.
    lr:
        Learning rate; ``None`` gives 1 for L-BFGS and 1e-3 for AdamW.
    lbfgs_iterations:
        Inner iterations (and objective evaluations) per L-BFGS step.
    history_size:
        L-BFGS curvature pairs kept.
    weight_decay:
        AdamW's decoupled weight decay.
    dummy_init:
        ``normal`` (N(0, 1) in model-input space), ``uniform`` (over the data
        range) or ``constant`` (``dummy_constant`` as a pixel value).
    dummy_constant:
        The pixel value of a ``constant`` dummy, in [0, 1].
    clamp:
        Clamp the dummy into the data range: ``off``; after every optimiser
        ``step`` (between ``torch.optim.LBFGS.step`` calls, as DLG-derived code
        does); or after every ``iteration`` (each L-BFGS inner update,
        projected L-BFGS; the same as ``step`` for AdamW).
    labels:
        ``joint``: optimise soft labels with the images (DLG). ``infer``: read
        them from the last layer's gradient first (iDLG at batch 1,
        ``batch_labels`` for batches; see :mod:`fedsim.attacks.toolkits.labels`) and
        keep them fixed.
    batch_labels:
        How ``labels = "infer"`` reads a batch's labels: ``count``
        (bias-corrected counting) or ``ilrg`` (iLRG, Ma et al. 2023).
    signed_gradient:
        AdamW steps on the sign of the objective's gradient (Inverting Gradients).
    step_decay:
        AdamW's learning rate drops tenfold at 3/8, 5/8 and 7/8 of the steps.
    batchnorm:
        What the attacker knows of the victim's BatchNorm statistics:
        ``none``, ``buffers`` or ``known`` (see
        :data:`~fedsim.attacks.toolkits.gradients.BatchNormKnowledge`).
    batchnorm_weight:
        Weight of the prior ``sum_l ||mu_l(x') - mu_l|| + ||var_l(x') - var_l||``
        pulling the dummy's BatchNorm statistics to the believed ones
        (DeepInversion's form; not tuned here).
    convergence:
        When a restart counts as converged, and whether the attack stops
        once every restart has (:mod:`fedsim.attacks.toolkits.convergence`).
    """

    paper_steps: ClassVar[dict[str, int]] = {"lbfgs": 300, "adamw": 20_000}

    restarts: int = 4
    steps: int | None = None
    optimizer: OptimizerName = "lbfgs"
    lr: float | None = None
    lbfgs_iterations: int = 20
    history_size: int = 100
    weight_decay: float = 0.01
    dummy_init: Literal["normal", "uniform", "constant"] = "normal"
    dummy_constant: float = 0.5
    clamp: Literal["off", "step", "iteration"] = "off"
    labels: Literal["joint", "infer"] = "joint"
    batch_labels: BatchLabels = "count"
    signed_gradient: bool = False
    step_decay: bool = False
    batchnorm: BatchNormKnowledge = "none"
    batchnorm_weight: float = 0.01
    convergence: ConvergenceRule = field(default_factory=ConvergenceRule)

    def __post_init__(self) -> None:
        require_restarts(self.restarts)
        require_inferred(self.labels, self.batch_labels)
        require(self.steps is None or self.steps >= 1, "steps", self.steps, "must be >= 1")
        require(self.lr is None or self.lr > 0, "lr", self.lr, "must be > 0")
        require(
            self.lbfgs_iterations >= 1, "lbfgs-iterations", self.lbfgs_iterations, "must be >= 1"
        )
        require(self.history_size >= 1, "history-size", self.history_size, "must be >= 1")
        require(self.weight_decay >= 0, "weight-decay", self.weight_decay, "must be >= 0")
        require(
            self.batchnorm_weight >= 0, "batchnorm-weight", self.batchnorm_weight, "must be >= 0"
        )
        require(
            0 <= self.dummy_constant <= 1,
            "dummy-constant",
            self.dummy_constant,
            "must be in [0, 1]",
        )

    @property
    def step_count(self) -> int:
        """``steps``, or the paper's count for the chosen optimiser."""
        return self.steps if self.steps is not None else self.paper_steps[self.optimizer]

    @property
    def learning_rate(self) -> float:
        """``lr``, or the paper's rate for the chosen optimiser."""
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]
