"""R-GAP (Zhu and Blaschko, ICLR 2021): closed-form recursive reconstruction at batch 1.

For a network of linear or convolutional layers, each followed by an
invertible activation (Sigmoid here) and ending in a linear layer, one
example's gradient determines the input layer by layer, from the top:

- the last layer's input ``x_L`` is read off its weight and bias gradients
  (:func:`~fedsim.attacks.toolkits.analytic.read_linear_input`) and its output
  gradient is its bias gradient, ``delta_L = dL/db_L``;
- going down, layer ``l``'s output ``x_l`` is known, hence its
  pre-activation ``u_l = sigmoid^{-1}(x_l)`` and its output gradient
  ``delta_l = sigmoid'(u_l) * W_{l+1}^T delta_{l+1}``; its input ``x_{l-1}``
  then satisfies two linear systems: the forward one ``W_l x_{l-1} = u_l - b_l``
  and the gradient one ``dL/dW_l = delta_l (x) x_{l-1}`` (for a conv, the
  correlation of ``delta_l`` with ``x_{l-1}``'s patches). Stacked (each block
  scaled to unit norm) they are solved in float64.

How a layer is solved (:meth:`RGAP.solve_input`; a linear layer is a 1x1
convolution of a 1x1 image with one channel per input value). The gradient block
of a plain convolution is block-diagonal over input channels with the same block
``M`` for every channel (rows: output channel and kernel offset; columns: the
channel's pixels; entries from ``delta`` alone; itself block-diagonal where kernel
offsets read disjoint pixels, as at stride 2). One SVD of ``M`` splits each
channel's pixels into directions the gradient fixes (``y = S^-1 U^T g_c``) and
the few it leaves free or nearly so (null and weakest singular directions); the
free coefficients of every channel come from one small least-squares system, the
forward equations plus the gradient's own rows in those directions
(:func:`split_solve`; exact data give the exact input, but it is not the stacked
least-squares solution, which also weighs the forward rows along the fixed
directions: measured 0.5-1 dB below it on LeNet-Zhu's digits, at 94 dB). Where the
free directions are too many for that (LeNet-Zhu's first layer: 300 gradient rows
for 1,024 pixels), the least-squares solution from the normal equations ``A^T A``,
built from the sparse forward matrix and ``M^T M`` and factored in float32, by
conjugate gradients in float64 preconditioned with that factor
(:func:`normal_solve`); any other convolution, and a layer too close to rank
deficiency for the normal equations to tell, take the dense QR of the stacked
system (:func:`dense_solve`).

The rank condition (the paper's): the stacked system has full column rank,
``rank = dim x_{l-1}``; each layer's rank, unknowns and equations are recorded in
``details["rank_condition"]``. Where a layer is rank-deficient, the directions its
equations leave undetermined come out arbitrary (the flagged fallback:
``details["rank_deficient"]`` lists those layers); the error then carries down to
the image.

Applies to the whole model's gradient (every layer shared: FedAvg, FedProx) at
batch 1, from a probe or one plain SGD step; ``lenet-zhu`` and ``lenet-sapag``
are such networks.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from fedsim.attacks.base import AttackSetting, Observation, Reconstruction
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.analytic import AnalyticAttack, read_linear_input
from fedsim.attacks.toolkits.closed_form import (
    exact_gradient,
    leaf_modules,
    one_step_residual,
    setting_model,
    uploaded,
)
from fedsim.attacks.toolkits.gradients import victim_model
from fedsim.attacks.toolkits.labels import infer_labels, label_method
from fedsim.attacks.toolkits.layer_systems import (
    ChannelSystem,
    Weighted,
    as_convolution,
    bias_map,
    dense_solve,
    forward_matrix,
    input_shapes,
    normal_solve,
    output_shape,
    split_solve,
    transposed,
    unit_scale,
    weight_gradient_matrix,
)
from fedsim.core.config import require
from fedsim.core.params.analytic import RGAPParams

MAX_UNKNOWNS = 4096
"""Most values in one layer's input. A layer whose gradient block leaves few directions
free is solved in milliseconds whatever its size (:func:`split_solve`: LeNet-Zhu's 3,072);
any other is a factored ``n x n`` normal matrix (:func:`normal_solve`), time growing with
the cube and memory with the square of this: 0.5 s at 3,072 (LeNet-Zhu's first layer on
three channels), so LeNet-SAPAG's 12,288 (724 of every channel's 1,024 pixels free) would
take about 64 times that and a 600 MB matrix."""


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


@ATTACKS.register("rgap")
class RGAP(AnalyticAttack):
    """Recursive closed-form reconstruction through Sigmoid conv nets at batch 1."""

    Params = RGAPParams
    params: RGAPParams
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
            cls.registered_name(),
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
            cls.registered_name(),
            f"solves each layer densely; model {setting.model.name!r} has a layer input of "
            f"{largest} values (at most {MAX_UNKNOWNS})",
        )

    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        """From the last layer down to the image, one least-squares solve per layer."""
        start = time.perf_counter()
        self.check_batch(observation)
        gradient = {
            k: v.double() for k, v in exact_gradient(observation, self.registered_name()).items()
        }
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
        tolerance = self.params.rank_tolerance
        conv = as_convolution(module, weight, shape)
        solved = None
        if conv is not None:
            system = ChannelSystem(conv, pre_activation.flatten(), delta, weight_grad)
            solved = split_solve(system, tolerance) or normal_solve(system)
            equations = system.equations
        if solved is None:
            blocks = [
                (forward_matrix(module, weight, shape), pre_activation.flatten()),
                (weight_gradient_matrix(module, weight, delta, shape), weight_grad.flatten()),
            ]
            stacked = torch.cat([m * unit_scale(float(m.norm())) for m, _ in blocks])
            target = torch.cat([t * unit_scale(float(m.norm())) for m, t in blocks])
            solved = dense_solve(stacked, target, tolerance)
            equations = len(stacked)
        solution, rank = solved
        condition = {"rank": rank, "unknowns": unknowns, "equations": equations}
        return solution.reshape(shape), condition
