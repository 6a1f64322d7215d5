"""Labels read from the last layer's gradient, before any image is optimised.

For softmax cross-entropy averaged over a batch of ``B`` examples, the last
linear layer ``logits = W h + b`` has

    dL/db_c   = (1/B) sum_n (p_nc - y_nc)
    dL/dW_c,: = (1/B) sum_n (p_nc - y_nc) h_n

with ``p`` the softmax outputs and ``y`` one-hot labels. Three readings follow:

- iDLG (Zhao et al. 2020), batch 1: with non-negative features ``h`` (after a
  Sigmoid or ReLU), only the true class has ``p - y < 0``, so its row of
  ``dL/dW`` is the only one with a negative sum: the label is that row.
- Counting (the bias-corrected / LLG family), batches: ``sum_n y_nc =
  B * (mean_n p_nc - dL/db_c)``. The attacker does not know the victim's mean
  softmax ``mean_n p_nc``; it estimates it from the model it was sent, on
  dummy inputs spread over the data range. A class with a negative bias
  gradient certainly occurs (``y`` must outweigh ``p >= 0``), so it gets at
  least one example; the rest go to the largest estimated counts. (Reading
  the absent classes' mean softmax off their bias gradient instead, exact
  where ``y = 0``, measured worse: an untrained model's peaked softmax often
  exceeds ``1/B`` on a class that occurs once, hiding it.)

Everything reads the gradient through
:func:`~fedsim.attacks.toolkits.gradients.target_gradient`: an update's sign is the
opposite of a gradient's, and reading it as a gradient would pick the
least likely class.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.func import functional_call

from fedsim.attacks.base import Observation
from fedsim.attacks.toolkits.gradients import target_gradient, victim_model
from fedsim.core.config import ModelConfig
from fedsim.core.models import InputSpec, build_model
from fedsim.core.params.labels import BatchLabels
from fedsim.core.seeds import SeedStream, derive_seed

DUMMY_INPUTS = 64
"""Dummy images used to estimate the victim's mean softmax output."""


@functools.lru_cache(maxsize=32)
def _last_linear(model: ModelConfig, spec: InputSpec) -> tuple[str, bool]:
    """Name prefix of the classifier's last ``nn.Linear`` and whether it has a bias."""
    net = build_model(model, spec, seed=derive_seed(SeedStream.LABEL_DUMMIES))
    name, layer = [(n, m) for n, m in net.named_modules() if isinstance(m, nn.Linear)][-1]
    return name, layer.bias is not None


def last_layer_gradient(
    observation: Observation, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The last layer's weight and bias gradient (``dL/dtheta`` orientation).

    Raises
    ------
    ValueError
        When the server did not receive the last layer.
    """
    prefix, has_bias = _last_linear(observation.model, observation.input_spec)
    weight = f"{prefix}.weight"
    if weight not in observation.shared:
        raise ValueError(f"label inference needs {weight!r}, which the server did not receive")
    gradient = target_gradient(observation, device)
    bias = gradient.get(f"{prefix}.bias") if has_bias else None
    return gradient[weight], bias


def idlg_label(observation: Observation, device: torch.device) -> torch.Tensor:
    """iDLG: the class whose last-layer weight-gradient row sums lowest, shape ``(1,)``."""
    weight, _ = last_layer_gradient(observation, device)
    return weight.sum(dim=1).argmin().view(1)


def mean_softmax_estimate(observation: Observation, device: torch.device) -> torch.Tensor:
    """The model's mean softmax on dummy inputs uniform over the data range, ``(K,)``."""
    model, params = victim_model(observation, device)
    spec = observation.input_spec
    gen = torch.Generator().manual_seed(derive_seed(SeedStream.LABEL_DUMMIES))
    pixels = torch.rand(
        DUMMY_INPUTS, spec.channels, spec.image_size, spec.image_size, generator=gen
    )
    inputs = observation.normalization.to_model(pixels).to(device)
    with torch.no_grad():
        return functional_call(model, params, (inputs,)).softmax(dim=-1).mean(dim=0)


def count_labels(observation: Observation, device: torch.device) -> torch.Tensor:
    """Bias-corrected counting: ``B`` labels (sorted) for a batch of ``B``."""
    _, bias = last_layer_gradient(observation, device)
    if bias is None:
        raise ValueError("counting labels needs the last layer's bias gradient")
    batch = observation.num_examples
    estimate = batch * (mean_softmax_estimate(observation, device) - bias)
    counts = torch.zeros_like(bias, dtype=torch.long)
    counts[torch.argsort(bias)[: min(int((bias < 0).sum()), batch)]] = 1
    for _ in range(batch - int(counts.sum())):
        counts[torch.argmax(estimate - counts)] += 1
    return torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)


def ilrg_system(
    observation: Observation, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """iLRG's linear system for the class counts, in float64.

    Returns the ``(K + 1) x K`` coefficients (first row ones, then ``q_j[i] -
    [i = j]`` in column ``j``), the right-hand side ``(B, B dL/db)`` and the
    classes the columns stand for: those with a non-zero bias gradient, whose
    embedding ratio is defined (a class whose bias gradient is exactly zero
    has ``y = 0`` and a softmax that underflowed to 0, so its count is 0).

    Raises
    ------
    ValueError
        When the last layer has no bias, or the server did not receive it.
    """
    prefix, _ = _last_linear(observation.model, observation.input_spec)
    weight_grad, bias_grad = last_layer_gradient(observation, device)
    if bias_grad is None:
        raise ValueError("iLRG needs the last layer's bias gradient; this model's has no bias")
    sent_weight = observation.global_params[f"{prefix}.weight"].to(device).double()
    sent_bias = observation.global_params[f"{prefix}.bias"].to(device).double()
    weight_grad, bias_grad = weight_grad.double(), bias_grad.double()
    classes = torch.nonzero(bias_grad).flatten()
    embeddings = weight_grad[classes] / bias_grad[classes, None]
    softmax = (embeddings @ sent_weight.T + sent_bias).softmax(dim=1)  # row j: q_j
    step = softmax.T - torch.eye(len(bias_grad), dtype=softmax.dtype, device=device)[:, classes]
    ones = torch.ones(1, len(classes), dtype=step.dtype, device=device)
    batch = observation.num_examples
    values = torch.cat([bias_grad.new_tensor([float(batch)]), batch * bias_grad])
    return torch.cat([ones, step]), values, classes


def ilrg_labels(observation: Observation, device: torch.device) -> torch.Tensor:
    """iLRG: ``B`` labels (sorted) from the least-squares class counts of :func:`ilrg_system`.

    As the paper does, the pseudo-inverse solution is rounded, negative counts
    become 0 and counts above ``B`` (an ill-conditioned system's) 0 too; then, to
    give exactly ``B`` labels, the counts rounded up furthest lose one (or those
    rounded down furthest gain one) until they sum to ``B``.
    """
    coefficients, values, classes = ilrg_system(observation, device)
    solution = torch.nan_to_num(torch.linalg.pinv(coefficients) @ values, 0.0, 0.0, 0.0)
    counts = solution.round().clamp(min=0)
    batch = observation.num_examples
    counts[counts > batch] = 0
    while (excess := int(counts.sum()) - batch) != 0:
        if excess > 0:
            rounded_up = torch.where(counts > 0, counts - solution, -torch.inf)
            counts[rounded_up.topk(min(excess, int((counts > 0).sum()))).indices] -= 1
        else:
            counts[(solution - counts).topk(min(-excess, len(counts))).indices] += 1
    return torch.repeat_interleave(classes, counts.long()).sort().values


def label_method(observation: Observation, batch_labels: BatchLabels = "count") -> str:
    """``idlg`` for a single example, ``batch_labels`` for a batch."""
    return "idlg" if observation.num_examples == 1 else batch_labels


def infer_labels(
    observation: Observation, device: torch.device, batch_labels: BatchLabels = "count"
) -> torch.Tensor:
    """The victim's labels, ``(B,)``: iDLG at batch 1, ``batch_labels`` otherwise."""
    method = label_method(observation, batch_labels)
    if method == "idlg":
        return idlg_label(observation, device)
    if method == "ilrg":
        return ilrg_labels(observation, device)
    return count_labels(observation, device)
