"""The parameters every optimising attack shares (restarts, the convergence rule), and those
of the optimising attacks outside the matching toolkit (``grnn``, ``tag``), by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval

from fedsim.core.bounds import Bounded
from fedsim.core.errors import require
from fedsim.core.params.attacks import ATTACK_PARAMS
from fedsim.core.params.labels import BatchLabels, require_inferred

MAX_RESTARTS = 1024
"""Restarts are optimised together, in memory: more is a typo, not an experiment."""


def require_restarts(restarts: int) -> None:
    """An attack's ``restarts`` within 1 .. :data:`MAX_RESTARTS`."""
    require(
        1 <= restarts <= MAX_RESTARTS,
        "restarts",
        restarts,
        f"must be between 1 and {MAX_RESTARTS}",
    )


@dataclass(frozen=True)
class ConvergenceRule(Bounded):
    """The stall rule's window and tolerance.

    Attributes
    ----------
    window:
        Steps over which the best objective must improve; ``None`` takes a
        tenth of the budget (at least :data:`MIN_WINDOW`).
    rtol:
        The relative improvement over a window below which a row has stalled.
    early_stop:
        End the optimisation once every live row has stalled.
    failure_ratio:
        A stalled row whose best objective is still above this fraction of
        its starting objective has stalled at a failure, not converged.
    """

    window: Annotated[int | None, Ge(1)] = None
    rtol: Annotated[float, Interval(ge=0, lt=1)] = 1e-3
    early_stop: bool = True
    failure_ratio: Annotated[float, Interval(gt=0, le=1)] = 0.5

    def steps_in_window(self, budget: int) -> int:
        """The window for an optimisation of ``budget`` steps."""
        return self.window if self.window is not None else max(MIN_WINDOW, budget // 10)


MIN_WINDOW = 5


WassersteinReading = Literal["l2", "sorted"]


@ATTACK_PARAMS.register("grnn")
@dataclass(frozen=True)
class GRNNParams(Bounded):
    """GRNN's hyper-parameters; the defaults are the paper's LeNet settings.

    Attributes
    ----------
    steps:
        RMSprop steps on the generator (the paper's code: 1000; named like
        the other attacks' optimiser steps).
    lr, momentum:
        RMSprop's learning rate and momentum (1e-4, 0.99).
    wasserstein:
        Reading of the "WD" term: ``l2`` or ``sorted`` (see the module docstring).
    tv_weight:
        ``alpha``; unset picks the paper's value for the architecture
        (1e-6 for ResNet models, 1e-3 otherwise).
    latent_dim, width:
        The generator's latent size (128) and last hidden width (32).
    restarts:
        Fresh generators and latents; the one with the lowest final gradient
        distance (the loss without TV, which the attacker can compute) is kept.
        The reconstruction's ``objective_trace`` is the full loss per
        step, its ``final_objective`` that distance.
    labels:
        ``generator``: the label branch's soft labels (GRNN). ``infer``: labels
        read from the last layer first (iDLG at batch 1, ``batch_labels`` for
        batches; see :mod:`fedsim.attacks.toolkits.labels`), fixed, and the label
        branch unused.
    batch_labels:
        How ``labels = "infer"`` reads a batch's labels: ``count``
        (bias-corrected counting) or ``ilrg`` (iLRG, Ma et al. 2023).
    convergence:
        When a restart counts as converged, and whether it stops early
        (:mod:`fedsim.attacks.toolkits.convergence`), on the full loss per step.
    """

    steps: Annotated[int, Ge(1)] = 1000
    lr: Annotated[float, Gt(0)] = 1e-4
    momentum: Annotated[float, Interval(ge=0, lt=1)] = 0.99
    wasserstein: WassersteinReading = "l2"
    tv_weight: Annotated[float | None, Ge(0)] = None
    latent_dim: int = 128
    width: int = 32
    restarts: int = 1
    labels: Literal["generator", "infer"] = "generator"
    batch_labels: BatchLabels = "count"
    convergence: ConvergenceRule = field(default_factory=ConvergenceRule)

    def __post_init__(self) -> None:
        super().__post_init__()
        # The generator's size grows with both (width squared): bounded so a typo is refused.
        require(1 <= self.latent_dim <= 4096, "latent-dim", self.latent_dim, "must be in 1..4096")
        require(1 <= self.width <= 1024, "width", self.width, "must be in 1..1024")
        require_restarts(self.restarts)
        require_inferred(self.labels, self.batch_labels)

    @property
    def step_count(self) -> int:
        """Optimiser steps, under the name every attack's ``Params`` answers to."""
        return self.steps


@ATTACK_PARAMS.register("tag")
@dataclass(frozen=True)
class TagParams(Bounded):
    """TAG's optimisation.

    Attributes
    ----------
    steps:
        Adam steps (the paper runs thousands; fedsim's default keeps an audit cheap).
    lr:
        Adam's learning rate on the token logits.
    alpha:
        Weight of the L1 term of the distance.
    init_scale:
        Standard deviation of the initial token logits.
    """

    steps: Annotated[int, Ge(1)] = 100
    lr: Annotated[float, Gt(0)] = 0.1
    alpha: Annotated[float, Ge(0)] = 0.01
    init_scale: Annotated[float, Gt(0)] = 1.0
