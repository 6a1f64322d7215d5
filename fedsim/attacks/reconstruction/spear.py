"""SPEAR (Dimitrov et al., NeurIPS 2024): a whole batch read exactly off a ReLU layer's gradient.

For the first layer ``z = W x + b`` of a network, followed by a ReLU, and a
batch of ``B`` examples (rows of ``X``, ``B x d``),

    dL/dW = D^T X,    dL/db = D^T 1,    D = (delta_1 ... delta_B)^T,  delta_n = (1/B) dL_n/dz_n,

so ``dL/dW`` has rank ``B``. A truncated SVD gives ``dL/dW = L R`` with
``L = U_B S_B`` (``m x B``) and ``R = V_B^T``; then ``D^T = L A`` and ``X =
A^{-1} R`` for an unknown invertible ``A`` (``B x B``). SPEAR finds ``A``'s
columns from the sparsity of ReLU's backward pass: ``delta_n`` is exactly
zero wherever example ``n``'s pre-activation is negative (about half the
units). If ``B - 1`` units chosen at random are all off for example ``n``,
the null vector ``a`` of those ``B - 1`` rows of ``L`` is (up to scale)
``A``'s column ``n``, and ``L a`` is then sparse far beyond the ``B - 1``
zeros every null vector has. A wrong guess is not, with one exception: units
off for two examples give mixes of their two columns, sparse where both are
off; :func:`distinct` drops a direction whose zeros lie inside a sparser
one's, and :func:`relu_consistent` rejects a batch the sent layer contradicts.
Random subsets are tried until ``B`` such directions are found (about ``B
2^(B-1)`` subsets: the cost doubles with every example, which is why SPEAR
stops near 25). Their scales come from the bias gradient: ``dL/db = L A 1``.

Labels: with the images known, example ``n`` with label ``c`` has the
first-layer gradient ``delta_n(c)``, which the sent model computes; the label
whose ``delta_n(c)`` matches the recovered ``L a_n`` is the example's label
(exact, where counting from the last layer can only give the multiset).

Exactness is checked by the recovered batch reproducing the intercepted
gradient (``details["gradient_residual"]``, every shared
tensor); ``converged`` is that residual below
:data:`~fedsim.attacks.toolkits.first_layer.EXACT`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch import nn

from fedsim.attacks.base import Observation, Reconstruction
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.closed_form import (
    leaf_modules,
    linear_layers,
    one_step_residual,
    reads_image,
)
from fedsim.attacks.toolkits.first_layer import EXACT, FirstLayerAttack, example_labels
from fedsim.core.params.analytic import SpearParams
from fedsim.core.seeds import SeedStream, derive_seed


def first_relu_layer(model: nn.Module) -> str | None:
    """The first linear layer if it reads the image and a ReLU follows it, else ``None``."""
    layers = linear_layers(model)
    if not layers or not reads_image(model, layers[0][0]):
        return None
    leaves = leaf_modules(model)
    names = [n for n, _ in leaves]
    after = names.index(layers[0][0]) + 1
    follows = after < len(leaves) and isinstance(leaves[after][1], nn.ReLU)
    return layers[0][0] if follows and layers[0][1].bias is not None else None


POOL = 4
"""Distinct sparse directions kept per example of the batch while sampling."""

FIRST_CHUNK = 256
"""Subsets in the first chunk; each further chunk doubles, up to ``SpearParams.chunk``."""


def candidate_pools(
    left: torch.Tensor, batch: int, params: SpearParams, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, int]]:
    """After each chunk of random subsets: the distinct sparse directions found so
    far (unit rows, sparsest first) and the subsets tried.

    ``left``: ``L`` restricted to units active for some example (``m' x B``).
    """
    units = left.shape[0]
    if batch == 1:
        yield torch.ones(1, 1, dtype=left.dtype), 0
        return
    needed = batch - 1 + max(2, int(params.min_sparsity * (units - batch + 1)))
    found = left.new_zeros(0, batch)
    found_zeros = torch.zeros(0, units, dtype=torch.bool)
    tried, size = 0, min(FIRST_CHUNK, params.chunk)
    while tried < params.samples:
        count = min(size, params.samples - tried)
        size = min(2 * size, params.chunk)  # small batches finish in the first chunks
        # A subset drawn with a repeated unit has rank below B - 1 and is dropped below.
        subsets = torch.randint(units, (count, batch - 1), generator=generator)
        # The null vector of each (B-1) x B system: the last right singular vector.
        _, values, vh = torch.linalg.svd(left[subsets])
        null = vh[:, -1, :]
        columns = null @ left.T
        peak = columns.abs().amax(dim=1, keepdim=True)
        zeros = columns.abs() <= params.zero_tolerance * peak
        # Units off for two examples at once leave a plane of null vectors: such
        # subsets (rank below B - 1) pin no direction down.
        single = values[:, -1] > params.zero_tolerance * values[:, 0]
        keep = (zeros.sum(dim=1) >= needed) & single
        found, found_zeros = distinct(
            torch.cat([found, null[keep]]),
            torch.cat([found_zeros, zeros[keep]]),
            POOL * batch,
            slack=batch,
        )
        tried += count
        yield found, tried


def distinct(
    candidates: torch.Tensor, zeros: torch.Tensor, most: int, slack: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """At most ``most`` directions among unit rows ``candidates``, with their zero masks.

    Sparsest first, each kept unless it equals a kept one up to sign or is a mix
    of kept ones: a mix of two examples' directions is zero only where both are
    (plus the odd unit where they cancel), so all but ``slack`` of its zeros lie
    inside a sparser kept direction's zeros. Two examples with similar off-sets
    give many such mixes, sparser than a third example's true direction.
    """
    order = torch.argsort(zeros.sum(dim=1), descending=True, stable=True)
    candidates, zeros = candidates[order], zeros[order]
    alike = (candidates @ candidates.T).abs() > 1 - 1e-6
    free = torch.ones(len(candidates), dtype=torch.bool)
    kept: list[int] = []
    while bool(free.any()) and len(kept) < most:
        first = int(torch.nonzero(free)[0])
        free &= ~alike[first]
        outside = (zeros[first] & ~zeros[kept]).sum(dim=1)
        if not bool((outside <= slack).any()):
            kept.append(first)
    return candidates[kept], zeros[kept]


def solve_batch(
    left: torch.Tensor, right: torch.Tensor, bias: torch.Tensor, directions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``A`` and ``X = A^{-1} R`` from ``A``'s column directions (``B x B``); the scales
    solve ``dL/db = L A 1`` by least squares."""
    scales = torch.linalg.lstsq(left @ directions, bias[:, None]).solution.flatten()
    mixing = directions * scales
    return mixing, torch.linalg.solve(mixing, right)


def relu_consistent(
    inputs: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    deltas: torch.Tensor,
    tolerance: float,
) -> bool:
    """Whether every unit a recovered example leaves off (``W x + b < 0`` beyond
    ``tolerance``, relative) has a zero recovered ``delta``, as a ReLU's backward
    pass demands. A wrong direction (a mix of two examples, sparse only where both
    are off) gives wrong inputs and breaks it. The converse is not asked: a unit
    that is on may have a tiny delta (seen: 8e-5 of the largest, a true one)."""
    z = inputs @ weight.T + bias
    off = z < -tolerance * z.abs().amax(dim=1, keepdim=True)
    zero = deltas.abs() <= tolerance * deltas.abs().amax(dim=1, keepdim=True)
    return bool(zero[off].all())


@ATTACKS.register("spear")
class Spear(FirstLayerAttack):
    """Exact batch recovery from a ReLU first layer's gradient (Dimitrov et al. 2024)."""

    Params = SpearParams
    params: SpearParams
    max_batch = 16

    layer_needs = "linear layer with a bias on the image, followed by a ReLU"
    first_layer = staticmethod(first_relu_layer)

    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        """Decompose the first layer's gradient, find ``A`` by sparsity, read the batch."""
        start = time.perf_counter()
        model, params, layer, weight, bias = self.first_layer_gradient(observation, seed)
        batch = observation.num_examples
        u, s, vh = torch.linalg.svd(weight, full_matrices=False)
        left, right = u[:, :batch] * s[:batch], vh[:batch]
        active = left.norm(dim=1) > self.params.zero_tolerance * left.norm(dim=1).max()
        generator = torch.Generator().manual_seed(derive_seed(SeedStream.ATTACK_SUBSETS, seed))
        sent = (
            params[f"{layer}.weight"].detach().cpu().double(),
            params[f"{layer}.bias"].detach().cpu().double(),
        )
        solved, found, tried = self.search(left, right, bias, active, sent, generator)
        spec, norm = observation.input_spec, observation.normalization
        shape = (batch, spec.channels, spec.image_size, spec.image_size)
        details = {
            "layer": layer,
            "rank_gap": float(s[batch] / s[0]) if len(s) > batch else 0.0,
            "directions_found": found,
            "subsets_tried": tried,
        }
        residual = float("inf")
        if solved is None:
            images = torch.full(shape, 0.5)
            labels = torch.zeros(batch, dtype=torch.long)
        else:
            inputs = solved[0].float().reshape(shape)
            labels = example_labels(model, params, layer, inputs, solved[1].float(), self.device)
            images = norm.to_pixels(inputs.cpu()).clamp(0, 1)
            residual = one_step_residual(observation, images, labels, seed, self.device)
        details["gradient_residual"] = residual
        return Reconstruction(
            images=images,
            labels=labels.cpu(),
            objective_trace=[],
            iterations=0,
            final_objective=residual,
            seconds=time.perf_counter() - start,
            converged=residual <= EXACT,
            details=details,
        )

    def search(
        self,
        left: torch.Tensor,
        right: torch.Tensor,
        bias: torch.Tensor,
        active: torch.Tensor,
        sent: tuple[torch.Tensor, torch.Tensor],
        generator: torch.Generator,
    ) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, int, int]:
        """The batch's inputs and deltas (``None`` if the subsets ran out), the
        directions found and the subsets tried.

        After every chunk, the ``B`` sparsest directions are tried: a batch whose
        units the sent first layer (``sent``: weight, bias) keeps off with a
        non-zero delta (:func:`relu_consistent`) holds a wrong direction, and
        the search goes on.
        """
        batch = left.shape[1]
        found = tried = 0
        for pool, tried in candidate_pools(left[active], batch, self.params, generator):
            found = len(pool)
            if found >= batch:
                mixing, inputs = solve_batch(left, right, bias, pool[:batch].T)
                deltas = (left @ mixing).T
                if relu_consistent(inputs, *sent, deltas, self.params.zero_tolerance):
                    return (inputs, deltas), found, tried
        return None, found, tried
