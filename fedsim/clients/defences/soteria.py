"""``soteria``: Sun et al.'s representation perturbation (CVPR 2021) on a probed gradient."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedsim.clients.base import ClientSpec
from fedsim.clients.defences.base import (
    DEFENCES,
    Defence,
    ProbeContext,
    Tensors,
)
from fedsim.core.config import ScenarioError
from fedsim.core.models import MODELS, InputSpec
from fedsim.core.params.defences import SoteriaParams


def defended_linear(model: nn.Module) -> tuple[str, nn.Linear]:
    """The layer Soteria defends: the first ``nn.Linear`` of ``model.classifier`` (the layer
    right after the feature extractor), with its qualified name."""
    classifier = getattr(model, "classifier", model)
    prefix = "classifier." if classifier is not model else ""
    for name, module in classifier.named_modules():
        if isinstance(module, nn.Linear):
            return prefix + name, module
    raise ValueError("soteria needs a model whose classifier has an nn.Linear layer")


def soteria_ratios(model: nn.Module, inputs: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Per feature f of the defended layer's input r: ``sum_b ||dr_f/dX_b|| / (r_bf + 0.1)``
    over the batch (Soteria's score, Sun et al. 2021; the authors' code loops over f).

    One forward pass; the input gradients of ``chunk`` features at a time come from one
    batched backward (one-hot cotangents). The model runs in eval mode, as the probe does.
    """
    _, layer = defended_linear(model)
    captured: list[torch.Tensor] = []
    hook = layer.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
    was_training = model.training
    model.eval()
    try:
        x = inputs.detach().clone().requires_grad_(True)
        model(x)
    finally:
        hook.remove()
        model.train(was_training)
    r = captured[0].flatten(1)  # [B, F]
    batch, features = r.shape
    norms = torch.empty(features, batch, dtype=r.dtype)
    eye = torch.eye(features, dtype=r.dtype, device=r.device)
    for start in range(0, features, chunk):
        stop = min(start + chunk, features)
        cotangents = eye[start:stop, None, :].expand(stop - start, batch, features)
        (grads,) = torch.autograd.grad(
            r, x, grad_outputs=cotangents, retain_graph=True, is_grads_batched=True
        )
        norms[start:stop] = grads.flatten(2).norm(dim=2).detach().cpu()
    return (norms / (r.detach().cpu().T + 0.1)).sum(dim=1)


@DEFENCES.register("soteria")
class Soteria(Defence):
    """Soteria (Sun et al., CVPR 2021), representation perturbation of one shared gradient:
    the ``share`` of the defended layer's input features with the smallest
    :func:`soteria_ratios` lose their columns of that layer's weight gradient (set to 0);
    every other tensor is shared as computed. It reads the probed batch and the model
    (:class:`ProbeContext`), so it acts only under the audit's ``probe`` threat model;
    training uploads pass unchanged."""

    Params = SoteriaParams
    probe_only = True

    def check(self, client: ClientSpec, strategy: str, key: str) -> None:
        spec = InputSpec(3, client.data.image_size, 10)  # layer types do not depend on it
        with torch.device("meta"):
            model = MODELS.get(client.model.name)(spec)
        try:
            defended_linear(model)
        except ValueError as err:
            raise ScenarioError(key, "soteria", str(err)) from None

    def mask(self, context: ProbeContext) -> torch.Tensor:
        """True for the features kept, False for the ``int(share * F)`` smallest ratios (ties
        by position)."""
        ratios = soteria_ratios(context.model, context.inputs)
        keep = torch.ones(len(ratios), dtype=torch.bool)
        keep[torch.argsort(ratios, stable=True)[: int(self.params.share * len(ratios))]] = False
        return keep

    def protect_gradient(
        self,
        gradient: Tensors,
        batch_size: int,
        rng: np.random.Generator,
        context: ProbeContext | None = None,
    ) -> Tensors:
        if context is None:
            raise ValueError("soteria needs the probed batch and model (a ProbeContext)")
        name, _ = defended_linear(context.model)
        key = name + ".weight"
        if self.params.share == 0 or key not in gradient:
            return gradient
        weight = gradient[key]
        dropped = ~self.mask(context).to(weight.device)
        return {**gradient, key: weight.masked_fill(dropped, 0)}
