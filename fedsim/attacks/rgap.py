"""R-GAP (Zhu and Blaschko, ICLR 2021): closed-form recursive reconstruction at batch 1.

For a network of linear or convolutional layers, each followed by an
invertible activation (Sigmoid here) and ending in a linear layer, one
example's gradient determines the input layer by layer, from the top:

- the last layer's input ``x_L`` is read off its weight and bias gradients
  (:func:`~fedsim.attacks.analytic.read_linear_input`) and its output
  gradient is its bias gradient, ``delta_L = dL/db_L``;
- going down, layer ``l``'s output ``x_l`` is known, hence its
  pre-activation ``u_l = sigmoid^{-1}(x_l)`` and its output gradient
  ``delta_l = sigmoid'(u_l) * W_{l+1}^T delta_{l+1}``; its input ``x_{l-1}``
  then satisfies two linear systems: the forward one ``W_l x_{l-1} = u_l - b_l``
  and the gradient one ``dL/dW_l = delta_l (x) x_{l-1}`` (for a conv, the
  correlation of ``delta_l`` with ``x_{l-1}``'s patches). Stacked (each block
  scaled to unit norm) they are solved by least squares in float64.

The rank condition (the paper's): the stacked system has full column rank,
``rank = dim x_{l-1}``; each layer's rank, unknowns and equations are recorded in
``details["rank_condition"]``. Where a layer is rank-deficient the least-squares
solution is the minimum-norm one (the flagged fallback: ``details["rank_deficient"]``
lists those layers); the error then carries down to the image.

Applies to the whole model's gradient (every layer shared: FedAvg, FedProx) at
batch 1, from a probe or one plain SGD step; ``lenet-zhu`` and ``lenet-sapag``
are such networks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.attacks.analytic import (
    AnalyticAttack,
    exact_gradient,
    leaf_modules,
    one_step_residual,
    read_linear_input,
    setting_model,
    uploaded,
)
from fedsim.attacks.base import AttackSetting, Observation, Reconstruction
from fedsim.attacks.gradients import victim_model
from fedsim.attacks.labels import infer_labels, label_method
from fedsim.attacks.registry import ATTACKS
from fedsim.core.config import require

Weighted = nn.Conv2d | nn.Linear

MAX_UNKNOWNS = 4096
"""Most values in one layer's input: each layer is a dense least-squares solve (QR), whose
time grows with the cube of this (LeNet-Zhu's largest, 3,072: most of the seconds an image
takes on one thread; LeNet-SAPAG's 12,288 would take tens of minutes). The systems
themselves are assembled from the convolutions' index pattern in milliseconds."""


@dataclass(frozen=True)
class RGAPParams:
    """R-GAP's settings.

    Attributes
    ----------
    row_floor:
        As :attr:`~fedsim.attacks.analytic.AnalyticFCParams.row_floor`, for the last layer.
    rank_tolerance:
        Singular values below this fraction of the largest count as zero in a
        layer's rank.
    """

    row_floor: float = 1e-4
    rank_tolerance: float = 1e-9

    def __post_init__(self) -> None:
        require(0 <= self.row_floor < 1, "row-floor", self.row_floor, "must be in [0, 1)")
        require(
            0 < self.rank_tolerance < 1,
            "rank-tolerance",
            self.rank_tolerance,
            "must be in (0, 1)",
        )


def sigmoid_chain(model: nn.Module) -> list[tuple[str, Weighted]] | None:
    """The weight layers of a ``(conv | linear, Sigmoid)* linear`` network (flattens
    allowed, every layer with a bias), in forward order; ``None`` for any other."""
    chain: list[tuple[str, Weighted]] = []
    waiting = False  # a weight layer waits for its Sigmoid
    for name, module in leaf_modules(model):
        if isinstance(module, Weighted) and module.bias is not None and not waiting:
            chain.append((name, module))
            waiting = True
        elif isinstance(module, nn.Sigmoid) and waiting:
            waiting = False
        elif not isinstance(module, nn.Flatten):
            return None
    last_is_linear = bool(chain) and isinstance(chain[-1][1], nn.Linear)
    return chain if waiting and last_is_linear else None


def linear_part(module: Weighted, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``module``'s map without its bias, with ``weight``, on one example ``x`` (no batch axis)."""
    if isinstance(module, nn.Linear):
        return F.linear(x.flatten(), weight)
    out = F.conv2d(
        x[None], weight, None, module.stride, module.padding, module.dilation, module.groups
    )
    return out[0]


@ATTACKS.register("rgap")
class RGAP(AnalyticAttack):
    """Recursive closed-form reconstruction through Sigmoid conv nets at batch 1."""

    Params = RGAPParams
    params: RGAPParams
    name = "rgap"
    max_batch = 1

    @classmethod
    def check_architecture(cls, setting: AttackSetting, key: str) -> None:
        """Every layer shared, the model a ``(conv | linear, Sigmoid)* linear`` chain, and
        no layer input over :data:`MAX_UNKNOWNS` values."""
        model = setting_model(setting)
        chain = sigmoid_chain(model)
        require(
            chain is not None and all(uploaded(f"{n}.weight", setting.uploads) for n, _ in chain),
            f"{key}.name",
            cls.name,
            "needs every layer shared and a chain of conv/linear layers with biases, each "
            f"followed by a Sigmoid, ending in a linear layer; model {setting.model.name!r} "
            f"under strategy {setting.strategy!r} is not",
        )
        assert chain is not None  # for mypy: required above
        channels = 3 if setting.data.channels == "rgb" else 1
        shapes = input_shapes(model, chain, channels, setting.data.image_size)
        largest = max(math.prod(shape) for shape in shapes.values())
        require(
            largest <= MAX_UNKNOWNS,
            f"{key}.name",
            cls.name,
            f"solves each layer densely; model {setting.model.name!r} has a layer input of "
            f"{largest} values (at most {MAX_UNKNOWNS})",
        )

    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        """From the last layer down to the image, one least-squares solve per layer."""
        start = time.perf_counter()
        self.check_batch(observation)
        gradient = {k: v.double() for k, v in exact_gradient(observation, self.name).items()}
        model, params = victim_model(observation, self.device, seed)
        chain = sigmoid_chain(model)
        if chain is None or any(f"{n}.weight" not in gradient for n, _ in chain):
            raise ValueError("rgap needs every layer of a Sigmoid conv/linear chain shared")
        weights = {n: params[f"{n}.weight"].detach().cpu().double() for n, _ in chain}
        biases = {n: params[f"{n}.bias"].detach().cpu().double() for n, _ in chain}
        spec = observation.input_spec
        shapes = input_shapes(model, chain, spec.channels, spec.image_size)
        largest = max(math.prod(shape) for shape in shapes.values())
        if largest > MAX_UNKNOWNS:
            raise ValueError(f"rgap solves layers of at most {MAX_UNKNOWNS} inputs, not {largest}")
        last = chain[-1][0]
        x, _, _ = read_linear_input(
            gradient[f"{last}.weight"], gradient[f"{last}.bias"], self.params.row_floor
        )
        x, delta = x.double(), gradient[f"{last}.bias"]
        conditions: list[dict[str, Any]] = []
        for (name, module), (above, upper) in zip(chain[-2::-1], chain[:0:-1], strict=True):
            # x: this layer's Sigmoid output; delta: the layer above's output gradient.
            x = x.reshape(shapes[above])
            back = transposed(upper, weights[above], x, delta)
            out = x.reshape(output_shape(module, weights[name], shapes[name]))
            back = back.reshape(out.shape)
            out = out.clamp(1e-12, 1 - 1e-12)
            delta = out * (1 - out) * back
            x, condition = self.solve_input(
                module,
                weights[name],
                torch.logit(out) - bias_map(biases[name], out),
                delta,
                gradient[f"{name}.weight"],
                shapes[name],
            )
            conditions.append({"layer": name, **condition})
        conditions.reverse()
        norm = observation.normalization
        images = norm.to_pixels(x.float().reshape(1, *shapes[chain[0][0]]).cpu()).clamp(0, 1)
        labels = infer_labels(observation, self.device).cpu()
        residual = one_step_residual(observation, images, labels, seed, self.device)
        deficient = [c["layer"] for c in conditions if c["rank"] < c["unknowns"]]
        return Reconstruction(
            images=images,
            labels=labels,
            objective_trace=[],
            iterations=0,
            final_objective=residual,
            seconds=time.perf_counter() - start,
            converged=not deficient,
            details={
                "rank_condition": conditions,
                "rank_deficient": deficient,
                "gradient_residual": residual,
                "labels": label_method(observation),
            },
        )

    def solve_input(
        self,
        module: Weighted,
        weight: torch.Tensor,
        pre_activation: torch.Tensor,
        delta: torch.Tensor,
        weight_grad: torch.Tensor,
        shape: tuple[int, ...],
    ) -> tuple[torch.Tensor, dict[str, int]]:
        """Layer input from ``W x = u - b`` and ``dL/dW = delta (x) x``, by least squares.

        Returns the input and the rank condition: ``rank``, ``unknowns``, ``equations``.
        """
        unknowns = math.prod(shape)
        blocks = [
            (forward_matrix(module, weight, shape), pre_activation.flatten()),
            (weight_gradient_matrix(module, weight, delta, shape), weight_grad.flatten()),
        ]
        system = torch.cat([m / m.norm() for m, _ in blocks])
        target = torch.cat([t / m.norm() for m, t in blocks])[:, None]
        # One QR gives both the rank (the diagonal of R) and, through R^T R x = A^T b
        # with one step of refinement (corrected semi-normal equations), the
        # least-squares solution: a third of an SVD's time on these systems.
        upper = torch.linalg.qr(system, mode="r").R
        diagonal = upper.diagonal().abs()
        rank = int((diagonal > self.params.rank_tolerance * diagonal.max()).sum())
        solution = semi_normal_solve(system, upper, target)
        solution = solution + semi_normal_solve(system, upper, target - system @ solution)
        condition = {"rank": rank, "unknowns": unknowns, "equations": len(system)}
        return solution.reshape(shape), condition


def forward_matrix(module: Weighted, weight: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The matrix of ``x -> W x`` (``module``'s map without its bias) on inputs of ``shape``."""
    if isinstance(module, nn.Linear):
        return weight
    pairs = conv_pairs(module, shape)
    if pairs is None:
        return _basis_images(lambda v: linear_part(module, weight, v), shape, weight.dtype)
    out_channels, in_channels = weight.shape[:2]
    o, c, e = pairs.each(out_channels, in_channels)
    matrix = torch.zeros(out_channels * pairs.positions, math.prod(shape), dtype=weight.dtype)
    values = weight.reshape(out_channels, in_channels, -1)[o, c, pairs.offset[e]]
    matrix.index_put_((o * pairs.positions + pairs.position[e], pairs.column(c, e)), values)
    return matrix


def weight_gradient_matrix(
    module: Weighted, weight: torch.Tensor, delta: torch.Tensor, shape: tuple[int, ...]
) -> torch.Tensor:
    """The matrix of ``x -> dL/dW``: the weight gradient of one example ``x`` whose output
    gradient is ``delta`` (linear in ``x``): ``delta (x) x`` for a linear layer, the
    correlation of ``delta`` with ``x``'s patches for a convolution."""
    if isinstance(module, nn.Linear):
        size = math.prod(shape)
        identity = torch.eye(size, dtype=delta.dtype)
        return (delta.flatten()[:, None, None] * identity).reshape(-1, size)
    pairs = conv_pairs(module, shape)
    if pairs is None:
        return _basis_images(
            lambda v: torch.func.grad(lambda w: (delta * linear_part(module, w, v)).sum())(weight),
            shape,
            delta.dtype,
        )
    out_channels, in_channels = weight.shape[:2]
    o, c, e = pairs.each(out_channels, in_channels)
    kernel = weight[0, 0].numel()
    matrix = torch.zeros(weight.numel(), math.prod(shape), dtype=delta.dtype)
    rows = (o * in_channels + c) * kernel + pairs.offset[e]
    values = delta.reshape(out_channels, -1)[o, pairs.position[e]]
    matrix.index_put_((rows, pairs.column(c, e)), values)
    return matrix


@dataclass(frozen=True)
class ConvPairs:
    """For one example through a convolution: which input pixel each (kernel offset,
    output position) reads, over the pairs that read the image, not its padding."""

    offset: torch.Tensor  # kernel offset (kh, kw flattened) of each pair
    position: torch.Tensor  # output position (flattened) of each pair
    pixel: torch.Tensor  # input pixel (flattened within a channel) each pair reads
    positions: int  # output positions
    pixels: int  # pixels of one input channel

    def each(
        self, out_channels: int, in_channels: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every (output channel, input channel, pair) as three index tensors."""
        o, c, e = torch.meshgrid(
            torch.arange(out_channels),
            torch.arange(in_channels),
            torch.arange(len(self.offset)),
            indexing="ij",
        )
        return o.flatten(), c.flatten(), e.flatten()

    def column(self, channel: torch.Tensor, pair: torch.Tensor) -> torch.Tensor:
        """The input value (channel, pixel) that ``pair`` reads in ``channel``."""
        return channel * self.pixels + self.pixel[pair]


def conv_pairs(module: nn.Conv2d, shape: tuple[int, ...]) -> ConvPairs | None:
    """:class:`ConvPairs` of a plain convolution (zero padding given as numbers, one
    group); ``None`` for any other, whose matrices come from the basis images."""
    plain = module.groups == 1 and module.padding_mode == "zeros"
    if not plain or isinstance(module.padding, str):
        return None
    _, height, width = shape
    # Each pixel's number (from 1) through unfold: what every pair reads; 0 is padding.
    numbers = torch.arange(1, height * width + 1, dtype=torch.float64).reshape(1, 1, height, width)
    read = F.unfold(numbers, module.kernel_size, module.dilation, module.padding, module.stride)
    read = read[0].round().long() - 1
    offset, position = (read >= 0).nonzero(as_tuple=True)
    return ConvPairs(offset, position, read[offset, position], read.shape[1], height * width)


def _basis_images(
    linear_map: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """The matrix of a linear map on inputs of ``shape``: its images of the unit basis."""
    basis = torch.eye(math.prod(shape), dtype=dtype).reshape(-1, *shape)
    return torch.vmap(lambda v: linear_map(v).flatten())(basis).T


def input_shapes(
    model: nn.Module, chain: list[tuple[str, Weighted]], channels: int, size: int
) -> dict[str, tuple[int, ...]]:
    """Each weight layer's input shape for one example (no batch axis), from a forward
    pass on the model's own device (``meta`` at validation: shapes only)."""
    shapes: dict[str, tuple[int, ...]] = {}

    def record(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            shapes[name] = tuple(args[0].shape[1:])

        return hook

    hooks = [m.register_forward_pre_hook(record(n)) for n, m in chain]
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model(torch.zeros(1, channels, size, size, device=device))
    finally:
        for hook in hooks:
            hook.remove()
    return shapes


def semi_normal_solve(
    system: torch.Tensor, upper: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """``x`` with ``R^T R x = A^T b`` (``R``: ``A``'s QR factor), by two triangular solves."""
    rhs = system.T @ target
    half = torch.linalg.solve_triangular(upper.T, rhs, upper=False)
    return torch.linalg.solve_triangular(upper, half, upper=True)


def transposed(
    module: Weighted, weight: torch.Tensor, x: torch.Tensor, delta: torch.Tensor
) -> torch.Tensor:
    """``W^T delta``: the gradient ``module``'s output gradient ``delta`` sends to its input
    (shaped like the input ``x``; the map is linear, so ``x`` only fixes the shapes)."""
    out, pull = torch.func.vjp(lambda v: linear_part(module, weight, v), x)[:2]
    (back,) = pull(delta.reshape(out.shape))
    return back


def output_shape(module: Weighted, weight: torch.Tensor, shape: tuple[int, ...]) -> torch.Size:
    """``module``'s output shape for one input of ``shape`` (no batch axis)."""
    return linear_part(module, weight, torch.zeros(shape, dtype=weight.dtype)).shape


def bias_map(bias: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A layer's bias broadcast over its output ``like`` (per channel for a conv map)."""
    return bias.reshape(-1, *([1] * (like.dim() - 1))) if like.dim() > 1 else bias
