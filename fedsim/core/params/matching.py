"""The parameters of the gradient-matching attacks (:class:`MatchingParams` and those that
extend it: ``dlg``, ``inverting-gradients``, ``sapag``, ``fedavg-leakage``, ``aligned-dlg``,
``unrolled-dlg`` and the defence-aware ones), by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

from annotated_types import Ge, Gt, Interval

from fedsim.core.bounds import Bounded
from fedsim.core.errors import require
from fedsim.core.params.attacks import ATTACK_PARAMS
from fedsim.core.params.labels import BatchLabels, require_inferred
from fedsim.core.params.optimising import ConvergenceRule, require_restarts

BatchNormKnowledge = Literal["none", "buffers", "known"]
"""What the attacker knows of the statistics a victim's BatchNorm layers used.

A client trains in train mode, so each BatchNorm layer normalises with its
batch's own mean and variance and the gradient flows through them: the
attacker's model of an update therefore always normalises the dummy batch
with the dummy's own statistics (an eval-mode forward with the true
statistics gives the same outputs but other parameter gradients). What it
knows of the true statistics becomes a prior pulling the dummy's statistics
towards them (Huang et al. 2021's BatchNorm-statistics term):
``none``: no prior. ``buffers``: read back from the running buffers the
client uploaded (FedAvg uploads them with the weights): exact after one local
step, the steps' average after several. ``known``: given the batch's
statistics (the strongest attacker of Huang et al. 2021; the audit hands
them over only when an attack asks for this). A probe gradient is computed in
eval mode with the buffers the server sent, which the attacker then uses
whatever it asks for.
"""


OptimizerName = Literal["lbfgs", "adamw"]


DEFAULT_LR: dict[str, float] = {"lbfgs": 1.0, "adamw": 1e-3}


@dataclass(frozen=True)
class MatchingParams(Bounded):
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
    steps: Annotated[int | None, Ge(1)] = None
    optimizer: OptimizerName = "lbfgs"
    lr: Annotated[float | None, Gt(0)] = None
    lbfgs_iterations: Annotated[int, Ge(1)] = 20
    history_size: Annotated[int, Ge(1)] = 100
    weight_decay: Annotated[float, Ge(0)] = 0.01
    dummy_init: Literal["normal", "uniform", "constant"] = "normal"
    dummy_constant: Annotated[float, Interval(ge=0, le=1)] = 0.5
    clamp: Literal["off", "step", "iteration"] = "off"
    labels: Literal["joint", "infer"] = "joint"
    batch_labels: BatchLabels = "count"
    signed_gradient: bool = False
    step_decay: bool = False
    batchnorm: BatchNormKnowledge = "none"
    batchnorm_weight: Annotated[float, Ge(0)] = 0.01
    convergence: ConvergenceRule = field(default_factory=ConvergenceRule)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_restarts(self.restarts)
        require_inferred(self.labels, self.batch_labels)

    @property
    def step_count(self) -> int:
        """``steps``, or the paper's count for the chosen optimiser."""
        return self.steps if self.steps is not None else self.paper_steps[self.optimizer]

    @property
    def learning_rate(self) -> float:
        """``lr``, or the paper's rate for the chosen optimiser."""
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]


@ATTACK_PARAMS.register("dlg", "unrolled-dlg")
@dataclass(frozen=True)
class DLGParams(MatchingParams):
    """DLG's settings: :class:`MatchingParams`, whose defaults are DLG's."""


@ATTACK_PARAMS.register("inverting-gradients", aliases=("ig",))
@dataclass(frozen=True)
class InvertingGradientsParams(MatchingParams):
    """Inverting Gradients' settings on top of :class:`MatchingParams`.

    Attributes
    ----------
    tv_weight:
        alpha, the weight of the total-variation prior.
    layer_weights:
        ``equal``, or ``linear`` (layer ``l`` of ``L`` weighted ``(L - l + 1) / L``:
        the first layers count most, as ``inversefed``'s ``linear``).
    cosine:
        ``joint``: one cosine over all layers (the authors' code);
        ``per-layer``: the weighted sum of per-layer cosine distances.
    unroll:
        Replay the client's local steps against a multi-step update (else
        read the update as one large-batch gradient).
    """

    steps: int | None = 4800
    optimizer: OptimizerName = "adamw"
    lr: float | None = 0.1
    weight_decay: float = 0.0
    signed_gradient: bool = True
    step_decay: bool = True
    clamp: Literal["off", "step", "iteration"] = "iteration"
    labels: Literal["joint", "infer"] = "infer"
    tv_weight: Annotated[float, Ge(0)] = 0.1
    layer_weights: Literal["equal", "linear"] = "equal"
    cosine: Literal["joint", "per-layer"] = "joint"
    unroll: bool = True


@ATTACK_PARAMS.register("sapag")
@dataclass(frozen=True)
class SAPAGParams(MatchingParams):
    """SAPAG's settings (the rest are documented on :class:`MatchingParams`).

    Attributes
    ----------
    depth_decay:
        ``Q_l = l ** -depth_decay`` for the layer at depth ``l`` (1 = the first
        layer), i.e. ``1/l`` by default; 0 weighs all layers alike.
    layer_weights:
        Explicit ``Q_l`` per depth, first layer first (overrides
        ``depth_decay``; must cover the deepest layer observed).
    """

    paper_steps: ClassVar[dict[str, int]] = {"lbfgs": 500, "adamw": 20_000}

    clamp: Literal["off", "step", "iteration"] = "iteration"
    depth_decay: Annotated[float, Ge(0)] = 1.0
    layer_weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            all(q > 0 for q in self.layer_weights),
            "layer-weights",
            list(self.layer_weights),
            "must all be > 0",
        )


@ATTACK_PARAMS.register("fedavg-leakage")
@dataclass(frozen=True)
class FedAvgLeakageParams(MatchingParams):
    """The attack's settings on top of :class:`MatchingParams`.

    Attributes
    ----------
    epoch_prior:
        Weight of the order-invariant prior tying every epoch's dummies to the
        first epoch's (mean squared pixel distance to the nearest image, both
        ways, in model-input space).
    label_count_weight:
        Weight of the prior pulling every epoch's soft label total to the
        counts read from the update.
    adam_smoothing:
        ``s`` of :func:`~fedsim.attacks.toolkits.replay.replay` against Adam/AdamW
        clients (0: the exact replay).
    """

    clamp: Literal["off", "step", "iteration"] = "iteration"
    dummy_init: Literal["normal", "uniform", "constant"] = "uniform"
    epoch_prior: Annotated[float, Ge(0)] = 1e-2
    label_count_weight: Annotated[float, Ge(0)] = 1e-2
    adam_smoothing: Annotated[float, Ge(0)] = 1.0


@ATTACK_PARAMS.register("aligned-dlg")
@dataclass(frozen=True)
class AlignedDLGParams(DLGParams):
    """DLG's settings plus the alignment weight lambda; labels are inferred."""

    alignment_weight: Annotated[float, Ge(0)] = 1.0
    codes: Annotated[int, Ge(1)] = 64
    labels: Literal["joint", "infer"] = "infer"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.labels == "infer", "labels", self.labels, "must be 'infer' (G_i needs classes)"
        )


DefenceName = Literal["soteria", "prune", "quantize"]


MODELLED: tuple[str, ...] = ("soteria", "prune", "quantize")


@dataclass(frozen=True)
class DefenceModel(Bounded):
    """The defence the attacker models, with the parameters it knows.

    Attributes
    ----------
    defence:
        ``soteria``, ``prune`` or ``quantize``.
    scope:
        ``prune``'s ranking: per tensor (``layer``) or over the upload (``global``).
    bits:
        ``quantize``'s bits (``2^(bits-1) - 1`` levels either side of 0).
    half:
        ``quantize`` casts to half precision instead.
    """

    defence: DefenceName = "soteria"
    scope: Literal["layer", "global"] = "layer"
    bits: Annotated[int, Interval(ge=2, le=16)] = 8
    half: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.defence in MODELLED, "defence", self.defence, f"must be one of {MODELLED}")
        require(
            self.scope in ("layer", "global"), "scope", self.scope, 'must be "layer" or "global"'
        )


@ATTACK_PARAMS.register("dlg-defence-aware")
@dataclass(frozen=True)
class DefenceAwareDLGParams(DefenceModel, DLGParams):
    """DLG's settings plus the modelled defence (:class:`DefenceModel`)."""

    def __post_init__(self) -> None:
        DLGParams.__post_init__(self)
        DefenceModel.__post_init__(self)


@ATTACK_PARAMS.register("ig-defence-aware")
@dataclass(frozen=True)
class DefenceAwareIGParams(DefenceModel, InvertingGradientsParams):
    """Inverting Gradients' settings plus the modelled defence (:class:`DefenceModel`)."""

    def __post_init__(self) -> None:
        InvertingGradientsParams.__post_init__(self)
        DefenceModel.__post_init__(self)
