"""The parameters of the closed-form attacks (docs/analytic-attacks.md), by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from fedsim.core.bounds import Bounded
from fedsim.core.params.attacks import ATTACK_PARAMS
from fedsim.core.params.optimising import require_restarts


@ATTACK_PARAMS.register("adam-signs")
@dataclass(frozen=True)
class AdamSignsParams(Bounded):
    """``adam-signs``' settings.

    Attributes
    ----------
    tolerance:
        Largest 90th percentile of ``||u_ij / u_i| - 1|`` over a row's nonzero
        entries for the row to count as one image's sign pattern (pure rows
        measured under 3e-3, mixed ones 0.1 and above: see the module).
    min_snr:
        How far (in multiples of float32 rounding) a row's background deviation must
        stand for Adam's ``eps`` to be read as pixel values (:func:`eps_read`); below
        it the mask is painted by the prior. Measured on 115 images found in 15
        clients of 4-16 digits: 20 put 36 at 30 dB or more but lost one under 20 dB
        that the prior had; 50 put 23 at 30 dB or more and lost none; 100, 10.
    """

    tolerance: Annotated[float, Interval(gt=0, lt=1)] = 0.02
    min_snr: Annotated[float, Gt(0)] = 50.0


@ATTACK_PARAMS.register("analytic-fc")
@dataclass(frozen=True)
class AnalyticFCParams(Bounded):
    """``analytic-fc``'s settings.

    Attributes
    ----------
    layer:
        The linear layer to read (a module name such as ``classifier.1``), or
        ``auto``: the first shared ``nn.Linear`` with a bias.
    row_floor:
        Rows whose bias gradient is below this fraction of the largest one are
        left out (their ratio is float noise over a near-zero divisor).
    inversion_steps:
        Adam steps inverting recovered features through the extractor (0:
        return the features only, with grey images).
    inversion_lr:
        Adam's learning rate for the inversion, in pixel units, constant.

    Inversion defaults, measured on four ``lenet5-split`` FedSGD digits (one
    thread): 1,000 steps at 0.2 gave 30.8 / 37.7 / 34.5 / 36.3 dB in about
    2.2 s each; 500 steps 28.2-34.7 dB; a tenfold decay at 3/8, 5/8, 7/8 (as
    Inverting Gradients) cost 3-7 dB at 500 steps, and lr 0.03-0.1 converged
    slower. Inverting Gradients (1,000 steps x 2 restarts) reached 27.6 /
    25.3 / 25.9 / 28.3 dB on the same uploads in 13-16 s.
    """

    layer: str = "auto"
    row_floor: Annotated[float, Interval(ge=0, lt=1)] = 1e-4
    inversion_steps: Annotated[int, Ge(0)] = 1000
    inversion_lr: Annotated[float, Gt(0)] = 0.2


@ATTACK_PARAMS.register("cocktail-party")
@dataclass(frozen=True)
class CocktailPartyParams(Bounded):
    """``cocktail-party``'s settings (the paper's FC-2 on Tiny-ImageNet by default).

    Attributes
    ----------
    steps:
        Adam steps over the un-mixing matrix at most (the paper: 25,000). The
        optimisation stops earlier once the objective improved by at most
        ``stall_rtol`` (relative) over a tenth of ``steps``.
    lr:
        Adam's learning rate, constant (the paper: 1e-3).
    lambda_tv:
        Weight of the total-variation prior on each source (the authors' FC-2
        setting: 3.1).
    lambda_mi:
        Weight of the mutual-independence penalty (the authors' FC-2: 1.47).
    temperature:
        ``T`` in the penalty ``exp(T |cos|) - 1`` (the authors' FC-2: 12.4).
    lambda_ne:
        Weight of the negentropy term (the paper: 1; the released code: 0).
    negentropy_a:
        ``a`` in ``G(s) = log cosh(a s) / a``, between 1 and 2 (FastICA's range).
    restarts:
        Un-mixing matrices optimised together: the identity, then random
        rotations; the lowest final objective is kept.
    stall_rtol:
        The relative improvement over a tenth of ``steps`` below which the
        optimisation has stalled (and stops); 0 never stops early.
    """

    steps: Annotated[int, Ge(1)] = 25_000
    lr: Annotated[float, Gt(0)] = 1e-3
    lambda_tv: Annotated[float, Ge(0)] = 3.1
    lambda_mi: Annotated[float, Ge(0)] = 1.47
    temperature: Annotated[float, Gt(0)] = 12.4
    lambda_ne: Annotated[float, Ge(0)] = 1.0
    negentropy_a: Annotated[float, Interval(ge=1, le=2)] = 1.0
    restarts: int = 1
    stall_rtol: Annotated[float, Interval(ge=0, lt=1)] = 1e-4

    def __post_init__(self) -> None:
        super().__post_init__()
        require_restarts(self.restarts)


@ATTACK_PARAMS.register("rgap")
@dataclass(frozen=True)
class RGAPParams(Bounded):
    """R-GAP's settings.

    Attributes
    ----------
    row_floor:
        As ``analytic-fc``'s ``row-floor``
        (:func:`~fedsim.attacks.toolkits.analytic.read_linear_input`), for the last layer.
    rank_tolerance:
        Singular values below this fraction of the largest count as zero in a
        layer's rank.
    """

    row_floor: Annotated[float, Interval(ge=0, lt=1)] = 1e-4
    rank_tolerance: Annotated[float, Interval(gt=0, lt=1)] = 1e-9


@ATTACK_PARAMS.register("spear")
@dataclass(frozen=True)
class SpearParams(Bounded):
    """SPEAR's settings.

    Attributes
    ----------
    samples:
        Most random ``(B - 1)``-unit subsets tried (in chunks of ``chunk``;
        the search stops once ``B`` directions are found).
    chunk:
        Most subsets solved together in one batched SVD (the first chunks are
        smaller, so small batches stop early).
    zero_tolerance:
        An entry of a candidate ``L a`` counts as zero below this fraction of
        its largest entry (float32 gradients, read in float64).
    min_sparsity:
        A candidate is a direction when this share of the units, beyond the
        ``B - 1`` zeros every candidate has, is zero.
    """

    samples: Annotated[int, Ge(1)] = 200_000
    chunk: Annotated[int, Ge(1)] = 4096
    zero_tolerance: Annotated[float, Interval(gt=0, lt=1)] = 1e-4
    min_sparsity: Annotated[float, Interval(gt=0, lt=1)] = 0.1


@ATTACK_PARAMS.register("box-vertices")
@dataclass(frozen=True)
class BoxVerticesParams(Bounded):
    """``box-vertices``' settings.

    Attributes
    ----------
    programmes_per_example:
        Most linear programmes solved, per example of the batch (each with a
        random objective; the search stops once every example is found).
    saturated:
        Share of the pixels a vertex must have on the box's faces (at the
        model-space value of 0 or 1) to count as an image, among the pixels
        that differ within the batch (those the same in every image, such as
        a digit's empty border, are on a face at every point of the span).
    slack:
        How far outside the box a pixel may lie, in pixel units (a float32
        upload ``w - lr g`` reads the gradient with rounding error).
    duplicate:
        Two vertices whose above-floor parts have at least this cosine are
        one image (the one with more saturated pixels is kept).

    Measured on ``mlp-2nn`` FedSGD uploads of real test digits (one thread,
    seeds 0-2): batches of 16, 15-16 of 16 images exact (87-120 dB) from
    44-69 programmes in 0.8-1.6 s; batches of 32, 22-28 of 32 at 20 dB or
    more from 217-320 programmes in 8-18 s.
    """

    programmes_per_example: Annotated[int, Ge(1)] = 10
    saturated: Annotated[float, Interval(gt=0, lt=1)] = 0.25
    slack: Annotated[float, Ge(0)] = 1e-4
    duplicate: Annotated[float, Interval(gt=0, lt=1)] = 0.95


@ATTACK_PARAMS.register("dager")
@dataclass(frozen=True)
class DagerParams:
    """DAGER's tolerances.

    Attributes
    ----------
    rank_tolerance:
        Singular values below this fraction of the largest do not count towards a layer's
        gradient rank.
    residual_tolerance:
        A candidate input belongs to the span when its projection residual, relative to its
        norm, is below this.
    max_prefixes:
        Most partial sequences at a position; beyond it the span admits too much to tell
        (near the rank limit) and the attack stops with nothing (``prefixes_cut``).
    """

    rank_tolerance: float = 1e-5
    residual_tolerance: float = 1e-3
    max_prefixes: int = 1024

    def __post_init__(self) -> None:
        for name, value in (
            ("rank-tolerance", self.rank_tolerance),
            ("residual-tolerance", self.residual_tolerance),
        ):
            if not 0 < value < 1:
                raise ValueError(f"dager {name} must be in (0, 1), got {value}")
        if self.max_prefixes < 1:
            raise ValueError(f"dager max-prefixes must be >= 1, got {self.max_prefixes}")
