"""A batch read off a first linear layer's gradient as the vertices of a polytope.

For the first layer ``z = W x + b`` and a batch of ``B`` examples,

    [dL/dW | dL/db] = sum_n delta_n [x_n, 1]^T,

so the rows of ``[dL/dW | dL/db]`` span the ``B`` augmented inputs ``[x_n, 1]``
(a truncated SVD gives an orthonormal basis ``R``, ``B x (d + 1)``). A point
``a^T R`` of that span whose last coordinate is 1 is an affine combination
``sum_n w_n x_n`` with ``sum_n w_n = 1``. Images live in a box: every pixel
lies between the model-space values of 0 and 1. Where the batch's images
saturate (many pixels exactly 0 or 1: digits, documents, masks), the affine
combinations that stay inside the box are, up to pixels that no mixture can
keep in range, the convex hull of the batch, whose vertices are the images
themselves. A linear programme over ``a`` (``B`` unknowns, ``2 d``
constraints) with a random objective ends on a vertex; repeated with random
objectives, it collects the images one by one (a coupon collector: about
``B ln B`` programmes). A vertex that is an image has most of its pixels on
the box's faces; one that is not (a mixture kept in range where supports
nest) has about ``B`` of them, and is dropped.

This is fedsim's own attack, not a published one; it is the "pure pixel"
idea of hyperspectral unmixing applied to the row space SPEAR reads. The
Cocktail Party Attack (Kariyappa et al., ICML 2023; ``cocktail-party``,
:mod:`fedsim.attacks.reconstruction.cocktail`) separates the same mixture by independent
component analysis instead, with its scales from the bias as here; on
``mlp-2nn`` batches of 16 real digits it recovers 4-10 of 16 at 20 dB (a
digit batch is far from independent: the centred digits' mean absolute
correlation is 0.27-0.33). Where images do not saturate (natural
photographs) the box does not pin the vertices, and this attack finds none:
it says so (``details["found"]``) rather than guess; ``cocktail-party``
recovers 5-8 of 16 such CIFAR-10 images.

Scales need no search: the constraint on the last coordinate fixes them.
Labels and ``converged`` come as in SPEAR: each example's label from its
recovered first-layer delta, and the recovered batch reproducing the
intercepted gradient.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linprog

from fedsim.attacks.base import Observation, Reconstruction
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.closed_form import one_step_residual
from fedsim.attacks.toolkits.first_layer import (
    EXACT,
    FirstLayerAttack,
    example_labels,
    first_linear_layer,
)
from fedsim.core.params.analytic import BoxVerticesParams
from fedsim.core.seeds import SeedStream, derive_seed


@dataclass
class VertexSearch:
    """The linear programmes over ``a`` (see the module docstring) and what they found."""

    basis: np.ndarray  # R, B x (d + 1): the last column is the constant coordinate
    low: np.ndarray  # d: each pixel's model-space value at 0
    high: np.ndarray  # d: ... at 1
    params: BoxVerticesParams

    def __post_init__(self) -> None:
        pixels = self.basis[:, :-1].T
        span = self.high - self.low
        # Pixels every affine combination shares (the same in every image of the batch,
        # e.g. a digit's empty border): their columns are multiples of the constant one.
        constant = self.basis[:, -1] / np.linalg.norm(self.basis[:, -1])
        off_line = pixels - np.outer(pixels @ constant, constant)
        scale = max(float(np.linalg.norm(pixels, axis=1).max()), 1e-300)
        self.free = np.linalg.norm(off_line, axis=1) > 1e-3 * scale
        self.a_ub = np.concatenate([-pixels, pixels])
        self.b_ub = np.concatenate(
            [-self.low + self.params.slack * span, self.high + self.params.slack * span]
        )
        self.found: list[np.ndarray] = []
        self.saturation: list[int] = []
        self.programmes = 0

    def vertex(self, objective: np.ndarray) -> np.ndarray | None:
        """The programme's optimal point ``a^T R`` (pixels only), or ``None`` if infeasible."""
        batch = len(self.basis)
        self.programmes += 1
        result = linprog(
            objective,
            A_ub=self.a_ub,
            b_ub=self.b_ub,
            A_eq=self.basis[:, -1][None],
            b_eq=[1.0],
            bounds=[(None, None)] * batch,
            method="highs",
        )
        return None if result.status != 0 else result.x @ self.basis[:, :-1]

    def polish(self, x: np.ndarray, on_faces: np.ndarray) -> np.ndarray:
        """The point of the span exactly on the faces ``x`` touches (least squares): the
        programme's optimum sits up to ``slack`` outside them, which moved pixels by
        up to a quarter of a grey level."""
        span = self.high - self.low
        target = np.where(np.abs(x - self.low) < np.abs(x - self.high), self.low, self.high)
        rows = np.concatenate([self.basis[:, :-1][:, on_faces], self.basis[:, -1:]], axis=1)
        values = np.concatenate([target[on_faces], [1.0]])
        a = np.linalg.lstsq(rows.T, values, rcond=None)[0]
        polished = a @ self.basis[:, :-1]
        return polished if np.abs(polished - x).max() < 0.05 * span.max() else x

    def keep(self, x: np.ndarray) -> bool:
        """Keep ``x`` if it is an image (saturated enough) not found before; whether it was new."""
        span = self.high - self.low
        on_faces = (np.abs(x - self.low) < 1e-3 * span) | (np.abs(x - self.high) < 1e-3 * span)
        count = int(on_faces[self.free].sum())
        if count < self.params.saturated * int(self.free.sum()):
            return False
        x = self.polish(x, on_faces)
        shape = (x - self.low) / max(float(np.linalg.norm(x - self.low)), 1e-300)
        for i, other in enumerate(self.found):
            known = (other - self.low) / max(float(np.linalg.norm(other - self.low)), 1e-300)
            if float(shape @ known) >= self.params.duplicate:
                if count > self.saturation[i]:
                    self.found[i], self.saturation[i] = x, count
                return False
        self.found.append(x)
        self.saturation.append(count)
        return True

    def run(self, rng: np.random.Generator) -> list[np.ndarray]:
        """The batch's images, most saturated first (at most ``B``).

        A mixture that stays in range can pass for an image; it has fewer pixels on
        the faces than the images it mixes. So the search goes on until ``B``
        programmes in a row found nothing new, and the ``B`` most saturated are kept.
        """
        batch = len(self.basis)
        quiet = 0
        for _ in range(self.params.programmes_per_example * batch):
            x = self.vertex(rng.standard_normal(batch))
            quiet = 0 if x is not None and self.keep(x) else quiet + 1
            if len(self.found) >= batch and quiet >= batch:
                break
        order = np.argsort(self.saturation, kind="stable")[::-1][:batch]
        return [self.found[i] for i in order]


@ATTACKS.register("box-vertices")
class BoxVertices(FirstLayerAttack):
    """A batch as the vertices of the in-range part of the first layer's row space."""

    Params = BoxVerticesParams
    params: BoxVerticesParams
    max_batch = 32

    layer_needs = "linear layer with a bias on the image"
    first_layer = staticmethod(first_linear_layer)

    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        """Span the augmented inputs, collect the in-range vertices, read labels."""
        start = time.perf_counter()
        model, params, layer, weight, bias = self.first_layer_gradient(observation, seed)
        batch = observation.num_examples
        augmented = torch.cat([weight, bias[:, None]], dim=1)
        _, s, vh = torch.linalg.svd(augmented, full_matrices=False)
        spec, norm = observation.input_spec, observation.normalization
        shape = (1, spec.channels, spec.image_size, spec.image_size)
        search = VertexSearch(
            vh[:batch].numpy(),
            norm.to_model(torch.zeros(shape)).flatten().double().numpy(),
            norm.to_model(torch.ones(shape)).flatten().double().numpy(),
            self.params,
        )
        kept = search.run(np.random.default_rng(derive_seed(SeedStream.ATTACK_VERTICES, seed)))
        found = len(kept)
        details = {
            "layer": layer,
            "rank_gap": float(s[batch] / s[0]) if len(s) > batch else 0.0,
            "found": found,
            "candidates": len(search.found),
            "programmes": search.programmes,
        }
        images = torch.full((batch, *shape[1:]), 0.5)
        labels = torch.zeros(batch, dtype=torch.long)
        residual = float("inf")
        if found:
            inputs = torch.as_tensor(np.stack(kept)).float().reshape(found, *shape[1:])
            images[:found] = norm.to_pixels(inputs).clamp(0, 1)
            augmented_inputs = torch.cat([inputs.flatten(1).double(), torch.ones(found, 1)], 1)
            deltas = torch.linalg.lstsq(augmented_inputs.T, augmented.T).solution  # found x m
            labels[:found] = example_labels(
                model, params, layer, inputs.to(self.device), deltas.float(), self.device
            ).cpu()
            if found == batch:
                residual = one_step_residual(observation, images, labels, seed, self.device)
        details["gradient_residual"] = residual
        return Reconstruction(
            images=images,
            labels=labels,
            objective_trace=[],
            iterations=0,
            final_objective=residual,
            seconds=time.perf_counter() - start,
            converged=residual <= EXACT,
            details=details,
        )
