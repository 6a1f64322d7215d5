"""The parameters of fedsim's leak analyses (:mod:`fedsim.attacks.leaks`), by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval

from fedsim.core.bounds import Bounded
from fedsim.core.errors import require
from fedsim.core.params import Schemas
from fedsim.core.params.labels import BatchLabels

LEAK_PARAMS = Schemas("leak analysis", group="fedsim.leaks")

Link = Literal["softmax", "linear"]
"""How ``shadow-labels`` maps its features to class shares."""


@LEAK_PARAMS.register("llg")
@dataclass(frozen=True)
class LLGParams(Bounded):
    """``llg``'s settings.

    Attributes
    ----------
    variant:
        ``llg`` (default): impact from the observation's own negative row sums,
        ``m = (sum of negative row sums / B) (1 + 1/K)``, no offset (no data).
        ``llg-plus``: impact and per-class offset from gradients of
        single-class batches of public data at the sent model (LLG+).
    calibration_batch:
        Examples per single-class public batch (``llg-plus``).
    calibration_repeats:
        Batches per class averaged (the paper's ``n = 10``).

    Where this differs from the paper: the row sums of a multi-step update are
    read as one large-batch gradient (``(w_global - w) / (lr * steps)``); the
    paper's federated experiments do the same. Its LLG* (impact from a model the
    attacker trained on its auxiliary data) is not implemented: the server here
    holds the sent model, which LLG+ already calibrates at.
    """

    variant: Literal["llg", "llg-plus"] = "llg"
    calibration_batch: Annotated[int, Ge(1)] = 16
    calibration_repeats: Annotated[int, Ge(1)] = 2


@LEAK_PARAMS.register("logit-shift")
@dataclass(frozen=True)
class LogitShiftParams(Bounded):
    """``logit-shift``'s settings.

    Attributes
    ----------
    support:
        ``all`` (default): every class gets a share. ``negative-rows``: only
        classes whose output-layer row sum is negative (LLG's property 1): better
        under SGD, far worse under Adam on large clients, where property 1
        misses present classes (TV 0.77 where ``all`` scored 0.29).
    temperature:
        Shares are ``softmax(temperature * mean logit shift)``; 1 is the
        label-shift model's own scale.
    """

    support: Literal["negative-rows", "all"] = "all"
    temperature: Annotated[float, Gt(0)] = 1.0


@LEAK_PARAMS.register("gradient-count")
@dataclass(frozen=True)
class GradientCountParams(Bounded):
    """``gradient-count``'s settings.

    Attributes
    ----------
    batch_labels:
        ``count``: bias-corrected counting; ``ilrg``: iLRG's least squares
        (:mod:`fedsim.attacks.toolkits.labels`). One example is read by iDLG either way.
    """

    batch_labels: BatchLabels = "count"


@LEAK_PARAMS.register("loss-drop", "gradient-alignment")
@dataclass(frozen=True)
class MembershipParams(Bounded):
    """A membership score's settings.

    Attributes
    ----------
    chunk:
        Candidates per forward pass (memory only; the scores do not depend on it).
    """

    chunk: Annotated[int, Ge(1)] = 256


Variance = Literal["per-candidate", "global"]
"""Whose spread a calibrated membership score divides by: each candidate's own over its
reference models, or one pooled over all candidates (LiRA's choice for few shadows)."""


@LEAK_PARAMS.register("fedmia")
@dataclass(frozen=True)
class FedMIAParams(Bounded):
    """``fedmia``'s settings.

    Attributes
    ----------
    statistic:
        ``confidence`` (default): the logit-scaled confidence ``log(p / (1 - p))`` of
        the true label at an uploaded model (the authors' code reads the logit
        margin, its close cousin); ``loss``: minus the loss (the paper's loss
        statistic; the sent model's loss is the same under every client, so this
        is loss-drop read against the round).
    variance:
        ``global`` (default): the spread over the round's other clients pooled over
        the candidates; ``per-candidate``: each candidate's own (the authors' code).
        With 3-15 other clients, ``global`` scored AUC 0.005-0.009 higher in each
        setting of ``bench/membership.py`` (docs/leaks.md).
    chunk:
        Candidates per forward pass (memory only).
    """

    statistic: Literal["confidence", "loss"] = "confidence"
    variance: Variance = "global"
    chunk: Annotated[int, Ge(1)] = 256


@LEAK_PARAMS.register("lira-offline")
@dataclass(frozen=True)
class LiraOfflineParams(Bounded):
    """``lira-offline``'s settings.

    Attributes
    ----------
    shadows:
        Shadow clients trained per round (shared by the round's clients).
    variance:
        ``global`` (default: the paper's advice below 64 shadows) or ``per-candidate``.
    max_examples:
        Cap on a shadow client's examples (0: the round's client sizes as they are).
    chunk:
        Candidates per forward pass (memory only).
    """

    shadows: Annotated[int, Ge(2)] = 8
    variance: Variance = "global"
    max_examples: Annotated[int, Ge(0)] = 0
    chunk: Annotated[int, Ge(1)] = 256


@LEAK_PARAMS.register("class-representatives")
@dataclass(frozen=True)
class RepresentativesParams(Bounded):
    """``class-representatives``' settings.

    Attributes
    ----------
    inversion_steps:
        Adam steps inverting the features to images (0: features only).
    inversion_lr:
        Adam's learning rate for the inversion, in pixel units (as ``analytic-fc``).
    """

    inversion_steps: Annotated[int, Ge(0)] = 1000
    inversion_lr: Annotated[float, Gt(0)] = 0.2


@LEAK_PARAMS.register("model-inversion")
@dataclass(frozen=True)
class ModelInversionParams(Bounded):
    """``model-inversion``'s settings (:mod:`fedsim.attacks.leaks.model_inversion`).

    Attributes
    ----------
    steps, lr:
        Adam steps and learning rate (pixel units) optimising the images, all
        classes in one batch, from the public class-mean images.
    differential:
        Weight of the differential term: the uploaded model's log-probability of
        the class minus the sent model's (what the client's model believes about
        the class beyond the global one); 0 inverts the uploaded model alone.
    prior_weight:
        Weight of the mean squared distance to the public class-mean image.
    tv_weight:
        Weight of the total variation (mean absolute neighbour difference).
    jitter:
        Standard deviation of the seeded noise added to the starting images.
    """

    steps: Annotated[int, Ge(0)] = 100
    lr: Annotated[float, Gt(0)] = 0.01
    differential: Annotated[float, Ge(0)] = 1.0
    prior_weight: Annotated[float, Ge(0)] = 10.0
    tv_weight: Annotated[float, Ge(0)] = 0.05
    jitter: Annotated[float, Ge(0)] = 0.0


@LEAK_PARAMS.register("generator-representatives")
@dataclass(frozen=True)
class GeneratorRepresentativesParams(Bounded):
    """``generator-representatives``' settings.

    Attributes
    ----------
    classes:
        ``"present"``: the classes whose output bias the update lowered (as
        ``class-representatives``; a balanced client's softmax bias gradients
        sum to zero, so some of its classes go unread); ``"all"``: every class
        (one the client lacks scores as a miss).
    extractor:
        The extractor estimate E~: ``"fitted"`` on the public data (see
        :mod:`fedsim.attacks.leaks.generator_leak`), or ``"random"`` (its
        initialisation, as ``aligned-dlg``).
    fit_steps, fit_batch_size, fit_lr:
        Adam steps, public batch size and learning rate fitting E~.
    feature_weight:
        Weight of ``MSE(E~(x), G_i(z, y))`` beside the cross-entropy in the fit.
    codes:
        Codes ``z`` per class averaged into the class's generated features.
    inversion_steps, inversion_lr:
        Adam steps and learning rate (pixel units) of the inversion.
    """

    classes: Literal["present", "all"] = "present"
    extractor: Literal["fitted", "random"] = "fitted"
    fit_steps: Annotated[int, Ge(0)] = 100
    fit_batch_size: Annotated[int, Ge(1)] = 32
    fit_lr: Annotated[float, Gt(0)] = 3e-3
    feature_weight: Annotated[float, Ge(0)] = 30.0
    codes: Annotated[int, Ge(1)] = 64
    inversion_steps: Annotated[int, Ge(0)] = 300
    inversion_lr: Annotated[float, Gt(0)] = 0.05


@LEAK_PARAMS.register("shadow-labels")
@dataclass(frozen=True)
class ShadowLabelsParams(Bounded):
    """``shadow-labels``' settings.

    Attributes
    ----------
    shadows:
        Shadow clients trained per round (shared by the round's clients).
    iid_share:
        Share of the shadows drawn IID from the public data; the rest draw
        class shares from Dirichlet priors of ``alphas`` in turn.
    alphas:
        Dirichlet concentrations of the label-skewed shadows.
    ridge:
        Ridge penalty on the standardised features (per regression row).
    max_examples:
        Cap on a shadow client's examples (0: the round's client sizes as they are).
    gate:
        Read as the prior below ``gate`` times the leave-one-out IID error (above).
    link:
        ``softmax`` (default) or ``linear`` (ridge least squares on the shares).
    reference:
        ``round``: a client's features against the round's other clients' mean;
        ``shadows``: against the IID shadows' mean (as the shadows are).
    min_round:
        Fewest clients in a round for the ``round`` reference.
    """

    shadows: Annotated[int, Ge(2)] = 8
    iid_share: Annotated[float, Interval(ge=0, le=1)] = 0.5
    alphas: tuple[float, ...] = (0.3, 1.0)
    ridge: Annotated[float, Ge(0)] = 0.1
    max_examples: Annotated[int, Ge(0)] = 0
    gate: Annotated[float, Ge(0)] = 1.5
    link: Link = "softmax"
    reference: Literal["round", "shadows"] = "round"
    min_round: Annotated[int, Ge(2)] = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            len(self.alphas) >= 1 and all(a > 0 for a in self.alphas),
            "alphas",
            self.alphas,
            "must be one or more concentrations > 0",
        )


@LEAK_PARAMS.register("words")
@dataclass(frozen=True)
class WordsParams:
    """No parameters: the rule is exact up to float rounding."""
