"""The parameters of fedsim's defences (:mod:`fedsim.clients.defences`), by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval

from fedsim.core.bounds import Bounded
from fedsim.core.errors import require
from fedsim.core.params import Schemas

DEFENCE_PARAMS = Schemas("defence", group="fedsim.defences")


@DEFENCE_PARAMS.register("gaussian")
@dataclass(frozen=True)
class GaussianParams(Bounded):
    """``sigma``: standard deviation of the noise on every uploaded coordinate."""

    sigma: Annotated[float, Ge(0)]


@DEFENCE_PARAMS.register("laplace")
@dataclass(frozen=True)
class LaplaceParams(Bounded):
    """``scale``: the Laplace scale b (standard deviation b * sqrt(2)) per coordinate."""

    scale: Annotated[float, Ge(0)]


@DEFENCE_PARAMS.register("clip")
@dataclass(frozen=True)
class ClipParams(Bounded):
    """``max-norm``: bound on the L2 norm of the whole update."""

    max_norm: Annotated[float, Gt(0)]


@DEFENCE_PARAMS.register("prune")
@dataclass(frozen=True)
class PruneParams(Bounded):
    """``share``: the fraction of the update's entries with the smallest magnitudes set to 0;
    ``scope``: ranked within each tensor (``layer``) or over the whole update (``global``)."""

    share: Annotated[float, Interval(ge=0, lt=1)]
    scope: Literal["layer", "global"] = "layer"


@DEFENCE_PARAMS.register("quantize")
@dataclass(frozen=True)
class QuantizeParams(Bounded):
    """``bits``: each tensor rounded to ``2^(bits-1) - 1`` levels either side of 0, up to its
    largest magnitude (symmetric uniform quantisation, round to nearest); ``half``: cast to
    IEEE half precision instead (``bits`` must then be 16)."""

    bits: Annotated[int, Interval(ge=2, le=16)] = 8
    half: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            not self.half or self.bits == 16,
            "half",
            self.half,
            "half precision is 16 bits: set bits = 16 or half = false",
        )


@DEFENCE_PARAMS.register("soteria")
@dataclass(frozen=True)
class SoteriaParams(Bounded):
    """``share``: the fraction of the defended layer's input features whose weight-gradient
    columns are zeroed (the authors' ``pruning_rate`` / 100; 0.6 is their README's
    Inverting Gradients example, ``--pruning_rate=60``)."""

    share: Annotated[float, Interval(ge=0, lt=1)] = 0.6


@DEFENCE_PARAMS.register("dp-sgd")
@dataclass(frozen=True)
class DPSGDParams(Bounded):
    """Opacus DP-SGD: per-example clipping norm, noise std / norm, accounting delta."""

    noise_multiplier: Annotated[float, Gt(0)] = 1.0
    max_grad_norm: Annotated[float, Gt(0)] = 1.0
    delta: Annotated[float, Interval(gt=0, lt=1)] = 1e-5
    accountant: Literal["rdp", "prv"] = "rdp"
