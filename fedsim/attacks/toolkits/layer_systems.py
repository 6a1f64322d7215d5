"""One layer's input as the solution of linear systems: R-GAP's solvers.

A layer's forward equations ``W x = u - b`` and its weight gradient's equations
``dL/dW = delta (x) x`` (a convolution's as the correlation of ``delta`` with ``x``'s
patches), built as matrices and solved in float64: the split of free and fixed directions
(:func:`split_solve`), the normal equations by preconditioned conjugate gradients
(:func:`normal_solve`) and the dense QR (:func:`dense_solve`). Which one a layer takes,
and why, is :class:`~fedsim.attacks.reconstruction.rgap.RGAP`'s docstring.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
import torch
import torch.nn.functional as F
from torch import nn

Weighted = nn.Conv2d | nn.Linear


def linear_part(module: Weighted, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``module``'s map without its bias, with ``weight``, on one example ``x`` (no batch axis)."""
    if isinstance(module, nn.Linear):
        return F.linear(x.flatten(), weight)
    out = F.conv2d(
        x[None], weight, None, module.stride, module.padding, module.dilation, module.groups
    )
    return out[0]


SPLIT_FREE_MAX = 512
"""Most free coefficients (all channels together) :func:`split_solve` takes on; a layer
whose gradient block leaves more undetermined (LeNet-Zhu's first: 724 of 1,024 pixels)
goes to :func:`normal_solve`. The split's small system costs the cube of this."""

WEAK_DIRECTIONS = 8
"""Per channel, the weakest directions the gradient does fix that :func:`split_solve`
still leaves free, so that the forward equations weigh in on them too. Measured on
LeNet-Zhu, digits 0 / 1: 91.6 / 91.1 dB with none, 93.7 / 94.5 dB with 8, 93.8 / 93.6 dB
with 16 (the dense least-squares solution: 94.2 / 95.2 dB)."""

NORMAL_PIVOT_FLOOR = 1e-3
"""The normal equations square the condition number and their factor is float32 (relative
precision 6e-8): a factor whose diagonal spans more than this (the stacked system's
condition number over about 1e3; LeNet-Zhu's layers measure 4-90) cannot tell a full-rank
layer from a deficient one at the rank tolerance, so such a layer goes to the dense QR."""

NORMAL_STEPS = 20
"""Most conjugate-gradient steps :func:`normal_solve` takes (measured: 2 reach
:data:`NORMAL_CONVERGED` on every LeNet-Zhu layer); a layer still short of it goes to the
dense QR."""

NORMAL_CONVERGED = 1e-13
"""The normal equations' residual, relative to ``A^T b``, at which the iteration stops:
float64's reach on these systems."""


@dataclass(frozen=True)
class Convolution:
    """A weight layer as a plain convolution: its geometry (an ``nn.Conv2d``, possibly on
    the ``meta`` device), its weight ``(out, in, kh, kw)``, the input's shape and which
    pixel each kernel offset reads at each output position."""

    module: nn.Conv2d
    weight: torch.Tensor
    shape: tuple[int, int, int]
    pairs: ConvPairs


def as_convolution(
    module: Weighted, weight: torch.Tensor, shape: tuple[int, ...]
) -> Convolution | None:
    """``module`` as a :class:`Convolution`: a linear layer is a 1x1 convolution of a 1x1
    image with one channel per input value; ``None`` for a convolution that is not plain
    (grouped, or padded by name or other than with zeros)."""
    if isinstance(module, nn.Linear):
        out_features, in_features = weight.shape
        module = nn.Conv2d(in_features, out_features, 1, device="meta")
        weight, shape = weight.reshape(out_features, in_features, 1, 1), (in_features, 1, 1)
    channels, height, width = shape
    pairs = conv_pairs(module, shape)
    if pairs is None:
        return None
    return Convolution(module, weight, (channels, height, width), pairs)


class ChannelSystem:
    """One layer's stacked system in its channel form: the forward equations ``F x = u``
    and, per input channel ``c``, the gradient equations ``M x_c = g_c`` with the same
    ``M`` for every channel; each block scaled to unit norm, as in the dense system."""

    def __init__(
        self,
        conv: Convolution,
        target: torch.Tensor,
        delta: torch.Tensor,
        weight_grad: torch.Tensor,
    ) -> None:
        self.conv = conv
        out_channels, self.channels = conv.weight.shape[:2]
        self.pixels = conv.pairs.pixels
        self.target = target  # u - b
        self.gradient = channel_gradient_matrix(conv.pairs, delta, out_channels)
        kernel = conv.weight[0, 0].numel()
        # (c, (o, k)): channel c's weight gradient in M's row order.
        self.channel_grad = (
            weight_grad.reshape(out_channels, self.channels, kernel).transpose(0, 1).flatten(1)
        )
        squares = conv.weight.square().sum((0, 1)).flatten()
        self.forward_scale = unit_scale(float(squares[conv.pairs.offset].sum().sqrt()))
        self.gradient_scale = unit_scale(math.sqrt(self.channels) * float(self.gradient.norm()))
        self.equations = len(target) + self.channels * len(self.gradient)

    @functools.cached_property
    def forward_matrix(self) -> scipy.sparse.csr_array:
        """``F``, sparse (only :func:`normal_solve` needs it whole)."""
        rows, columns, values = forward_entries(self.conv.weight, self.conv.pairs)
        return scipy.sparse.csr_array(
            (values.numpy(), (rows.numpy(), columns.numpy())),
            shape=(len(self.target), self.channels * self.pixels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F x`` for the input ``x`` (flat), as the layer computes it."""
        conv = self.conv
        return linear_part(conv.module, conv.weight, x.reshape(conv.shape)).flatten()

    def normal_map(self, x: torch.Tensor) -> torch.Tensor:
        """``A^T A x`` for the scaled stacked system ``A``, through its two blocks."""
        by_forward = self.forward_matrix.T @ (self.forward_matrix @ x.numpy())
        by_gradient = (x.reshape(self.channels, self.pixels) @ self.gradient.T) @ self.gradient
        return (
            self.forward_scale**2 * torch.from_numpy(by_forward)
            + self.gradient_scale**2 * by_gradient.flatten()
        )

    def normal_target(self) -> torch.Tensor:
        """``A^T b`` for the scaled stacked system ``A x = b``."""
        by_forward = torch.from_numpy(self.forward_matrix.T @ self.target.numpy())
        by_gradient = (self.channel_grad @ self.gradient).flatten()
        return self.forward_scale**2 * by_forward + self.gradient_scale**2 * by_gradient


def unit_scale(norm: float) -> float:
    """What scales a block of the stacked system to unit norm (1 for an all-zero block, as
    a layer whose weights are all zero has: it says nothing either way)."""
    return 1 / norm if norm > 0 else 1.0


def conjugate_gradients(
    system: ChannelSystem,
    start: torch.Tensor,
    precondition: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor | None:
    """The normal equations ``A^T A x = A^T b`` solved in float64 by preconditioned
    conjugate gradients from ``start``; ``None`` if :data:`NORMAL_STEPS` steps do not bring
    the residual to :data:`NORMAL_CONVERGED` of ``A^T b``."""
    target = system.normal_target()
    x, residual = start, target - system.normal_map(start)
    step = precondition(residual)
    direction, alignment = step, float(residual @ step)
    for _ in range(NORMAL_STEPS):
        if float(residual.norm()) <= NORMAL_CONVERGED * float(target.norm()):
            return x
        mapped = system.normal_map(direction)
        length = alignment / float(direction @ mapped)
        x, residual = x + length * direction, residual - length * mapped
        step = precondition(residual)
        alignment, previous = float(residual @ step), alignment
        direction = step + (alignment / previous) * direction
    return None


def split_solve(system: ChannelSystem, tolerance: float) -> tuple[torch.Tensor, int] | None:
    """The input from the null-space split of the gradient block, with its rank; ``None``
    where more than :data:`SPLIT_FREE_MAX` coefficients would be left free.

    With ``M = U S V^T``, each channel's coordinates ``V^T x_c`` along singular values
    above the weakest are fixed by the gradient alone (``S^-1 U^T g_c``); the rest (the
    null space and the :data:`WEAK_DIRECTIONS` weakest) of every channel are solved
    together from the forward equations and the gradient rows along them (small, dense).
    Exact data give the exact input. The rank is exact too: the fixed coordinates count
    once each, plus the rank of the small system (the stacked system is block-triangular
    in these coordinates).
    """
    channels, pixels, gradient = system.channels, system.pixels, system.gradient
    if channels * (pixels - min(gradient.shape)) > SPLIT_FREE_MAX:
        return None
    singular, right, along = channel_svd(system)
    rank = int((singular > tolerance * singular[0]).sum()) if float(singular[0]) > 0 else 0
    if channels * (pixels - rank) > SPLIT_FREE_MAX:
        return None
    weak = max(0, min(WEAK_DIRECTIONS, rank, SPLIT_FREE_MAX // channels - (pixels - rank)))
    fixed = rank - weak
    x = (along[:, :fixed] / singular[:fixed]) @ right[:fixed]
    free = pixels - fixed
    if free == 0:
        return x.flatten(), channels * pixels
    directions = right[fixed:]  # (free, pixels), orthonormal rows
    conv = system.conv
    per_channel = conv.weight.transpose(0, 1).reshape(-1, 1, *conv.weight.shape[2:])
    module = conv.module
    images = directions.reshape(free, 1, *conv.shape[1:])
    responses = F.conv2d(images, per_channel, None, module.stride, module.padding, module.dilation)
    # rows: F's (output channel, position); columns: (channel, free direction)
    forward_rows = responses.reshape(free, channels, -1).permute(2, 1, 0).flatten(1)
    strengths, measured = singular[fixed:], along[:, fixed:]  # 0 along M's null space
    scale_f, scale_g = system.forward_scale, system.gradient_scale
    stacked = torch.cat([scale_f * forward_rows, torch.diag(scale_g * strengths.repeat(channels))])
    target = torch.cat(
        [scale_f * (system.target - system.forward(x.flatten())), scale_g * measured.flatten()]
    )
    coefficients, free_rank = dense_solve(stacked, target, tolerance)
    x = x + coefficients.reshape(channels, free) @ directions
    return x.flatten(), channels * fixed + free_rank


def gradient_blocks(system: ChannelSystem) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``M``'s independent blocks as (rows, columns) index pairs, covering every column
    once: ``M`` falls apart wherever groups of kernel offsets read disjoint sets of pixels
    (a stride-2 convolution: one block per phase of the pixel grid, four on LeNet-Zhu's
    first two layers); pixels no offset reads are blocks without rows."""
    pairs, pixels = system.conv.pairs, system.pixels
    kernel, out_channels = pairs.kernel, len(system.gradient) // pairs.kernel
    # Offsets and pixels as one graph, a kernel offset joined to every pixel it reads.
    edges = scipy.sparse.coo_array(
        (np.ones(len(pairs.offset)), (pairs.offset.numpy(), kernel + pairs.pixel.numpy())),
        shape=(kernel + pixels, kernel + pixels),
    )
    _, labels = scipy.sparse.csgraph.connected_components(edges, directed=False)
    offset_label, pixel_label = torch.from_numpy(labels[:kernel]), torch.from_numpy(labels[kernel:])
    blocks = []
    for label in pixel_label.unique():
        offsets = (offset_label == label).nonzero()[:, 0]
        rows = (torch.arange(out_channels)[:, None] * kernel + offsets).flatten()
        blocks.append((rows, (pixel_label == label).nonzero()[:, 0]))
    return blocks


def channel_svd(system: ChannelSystem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``M = U S V^T`` in full, block by block (:func:`gradient_blocks`: the same
    decomposition in a fraction of the time): the singular values ``S`` (one per pixel,
    descending, 0 along the null space), ``V^T`` (pixels x pixels) and ``U^T g_c`` for
    every channel (channels x pixels, 0 beyond the rank)."""
    gradient, pixels = system.gradient, system.pixels
    singular = torch.zeros(pixels, dtype=gradient.dtype)
    right = torch.zeros(pixels, pixels, dtype=gradient.dtype)
    along = torch.zeros(system.channels, pixels, dtype=gradient.dtype)
    start = 0
    for rows, columns in gradient_blocks(system):
        end = start + len(columns)
        if len(rows) == 0:  # pixels no offset reads: M's zero columns
            right[start:end, columns] = torch.eye(len(columns), dtype=gradient.dtype)
        else:
            left, values, vectors = torch.linalg.svd(
                gradient[rows][:, columns], full_matrices=len(rows) < len(columns)
            )
            count = len(values)
            singular[start : start + count] = values
            right[start:end, columns] = vectors
            along[:, start : start + count] = system.channel_grad[:, rows] @ left[:, :count]
        start = end
    order = singular.argsort(descending=True, stable=True)
    return singular[order], right[order], along[:, order]


def normal_solve(system: ChannelSystem) -> tuple[torch.Tensor, int] | None:
    """The least-squares input from the normal equations ``A^T A x = A^T b``, by conjugate
    gradients in float64 preconditioned with a float32 Cholesky factor of ``A^T A``; ``None``
    where that factor says the layer is too close to rank deficiency
    (:data:`NORMAL_PIVOT_FLOOR`): the dense QR tells.

    ``A^T A`` is the sparse forward matrix's Gram matrix plus ``M^T M`` on each channel's
    diagonal block, formed and factored in float32 (half a float64 factor's time); the
    iteration applies ``A`` and ``A^T`` in float64, so it converges to the float64
    least-squares solution, in a few steps as the float32 factor is nearly exact.
    """
    channels, pixels = system.channels, system.pixels
    single = system.forward_matrix.astype("float32")
    gram = torch.from_numpy((single.T @ single).toarray())
    gram *= system.forward_scale**2
    gradient = system.gradient.float()
    channel_gram = torch.zeros(pixels, pixels)
    for rows, columns in gradient_blocks(system):
        part = gradient[rows][:, columns]
        channel_gram[columns[:, None], columns] = system.gradient_scale**2 * (part.T @ part)
    for c in range(channels):
        diagonal_block = slice(c * pixels, (c + 1) * pixels)
        gram[diagonal_block, diagonal_block] += channel_gram
    factor, info = torch.linalg.cholesky_ex(gram)
    diagonal = factor.diagonal()
    if int(info) != 0 or float(diagonal.min()) < NORMAL_PIVOT_FLOOR * float(diagonal.max()):
        return None

    def precondition(residual: torch.Tensor) -> torch.Tensor:
        return torch.cholesky_solve(residual.float()[:, None], factor)[:, 0].double()

    x = conjugate_gradients(system, precondition(system.normal_target()), precondition)
    return None if x is None else (x, channels * pixels)


def dense_solve(
    system: torch.Tensor, target: torch.Tensor, tolerance: float
) -> tuple[torch.Tensor, int]:
    """The least-squares solution of a dense system and its rank (diagonal entries of QR's
    ``R`` above ``tolerance`` of the largest)."""
    # One QR gives both the rank (the diagonal of R) and, through R^T R x = A^T b
    # with one step of refinement (corrected semi-normal equations), the
    # least-squares solution: a third of an SVD's time on these systems.
    target = target[:, None]
    upper = torch.linalg.qr(system, mode="r").R
    diagonal = upper.diagonal().abs()
    rank = int((diagonal > tolerance * diagonal.max()).sum())
    solution = semi_normal_solve(system, upper, target)
    solution = solution + semi_normal_solve(system, upper, target - system @ solution)
    return solution[:, 0], rank


def forward_matrix(module: Weighted, weight: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The matrix of ``x -> W x`` (``module``'s map without its bias) on inputs of ``shape``."""
    if isinstance(module, nn.Linear):
        return weight
    pairs = conv_pairs(module, shape)
    if pairs is None:
        return _basis_images(lambda v: linear_part(module, weight, v), shape, weight.dtype)
    rows, columns, values = forward_entries(weight, pairs)
    matrix = torch.zeros(weight.shape[0] * pairs.positions, math.prod(shape), dtype=weight.dtype)
    matrix.index_put_((rows, columns), values)
    return matrix


def forward_entries(
    weight: torch.Tensor, pairs: ConvPairs
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A plain convolution's forward matrix as (row, column, value) entries: row
    ``(output channel, position)``, column ``(input channel, pixel)``."""
    out_channels, in_channels = weight.shape[:2]
    o, c, e = pairs.each(out_channels, in_channels)
    values = weight.reshape(out_channels, in_channels, -1)[o, c, pairs.offset[e]]
    return o * pairs.positions + pairs.position[e], pairs.column(c, e), values


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
    block = channel_gradient_matrix(pairs, delta, out_channels)
    block = block.reshape(out_channels, -1, pairs.pixels)
    # dL/dW[o, c, k] reads channel c only, through the same block for every channel.
    identity = torch.eye(in_channels, dtype=delta.dtype)
    matrix = torch.einsum("okp,cd->ockdp", block, identity)
    return matrix.reshape(weight.numel(), math.prod(shape))


def channel_gradient_matrix(
    pairs: ConvPairs, delta: torch.Tensor, out_channels: int
) -> torch.Tensor:
    """The block ``M`` of a plain convolution's weight gradient on one input channel:
    ``dL/dW[o, c, k] = sum_p M[(o, k), p] x[c, p]``, the same for every channel (row
    ``(output channel, kernel offset)``, column pixel; entries from ``delta`` alone)."""
    kernel = pairs.kernel
    o, e = torch.meshgrid(
        torch.arange(out_channels), torch.arange(len(pairs.offset)), indexing="ij"
    )
    o, e = o.flatten(), e.flatten()
    matrix = torch.zeros(out_channels * kernel, pairs.pixels, dtype=delta.dtype)
    values = delta.reshape(out_channels, -1)[o, pairs.position[e]]
    matrix.index_put_((o * kernel + pairs.offset[e], pairs.pixel[e]), values)
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
    kernel: int  # kernel offsets

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
    pixel = read[offset, position]
    return ConvPairs(offset, position, pixel, read.shape[1], height * width, read.shape[0])


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
