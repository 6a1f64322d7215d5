"""``tag``: TAG (Deng et al., EMNLP Findings 2021), gradient matching over relaxed tokens.

Dummy token logits ``Z`` ``(B, T + 1, V)`` (one row per window token: ``T`` inputs and
the last, predicted one) are optimised with Adam so that the model's gradient on the soft
batch matches the observed one under TAG's distance ``sum_l ||g'_l - g_l||^2 + alpha
||g'_l - g_l||_1``. The soft inputs are ``softmax(Z) E`` (E the sent token embedding)
and the soft next-token targets ``softmax(Z)`` shifted by one, so the embedding's own
gradient is matched too; the recovered sequence is ``argmax Z`` over the ``T`` inputs.

Where fedsim differs from the paper and its code: the paper optimises continuous dummy
embeddings and soft labels and maps each embedding to its nearest token; here the inputs
and targets are one relaxed distribution per position (the targets of a next-token model
are its inputs shifted, so one variable serves both), and the budget is small (steps,
restarts) so that the audit stays cheap; the paper's 1,500+ steps are a parameter away.
"""

from __future__ import annotations

import time
from typing import ClassVar

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from fedsim.attacks.base import Attack, AttackSetting, Observation, Reconstruction
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.text_victim import (
    check_text_setting,
    observed_gradient,
    one_step,
    sent_model,
)
from fedsim.core.models import SplitNet
from fedsim.core.params.optimising import TagParams
from fedsim.core.raw import TEXT
from fedsim.core.threat import ONE_CLIENT
from fedsim.text.models import TransformerBody


def soft_forward(body: TransformerBody, soft: torch.Tensor) -> torch.Tensor:
    """``body`` on a relaxed batch ``soft`` ``(B, T, V)`` (token distributions)."""
    length = soft.shape[1]
    positions = torch.arange(length, device=soft.device)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(length, device=soft.device)
    x = soft @ body.embedding.weight + body.position(positions)
    return body.norm(body.blocks(x, mask=mask, is_causal=True))


@ATTACKS.register("tag")
class Tag(Attack):
    """TAG's gradient matching on relaxed token embeddings (L2 + alpha L1)."""

    Params = TagParams
    modality: ClassVar[str] = TEXT
    threat_models = ONE_CLIENT

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        check_text_setting(setting, key, "tag")

    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        """The argmax tokens of the relaxed batch that best matched the gradient."""
        start = time.perf_counter()
        params: TagParams = self.params
        model = sent_model(observation, self.device)
        for p in model.parameters():
            p.requires_grad_(True)
        named = dict(model.named_parameters())
        names = [n for n in observation.shared if n in named]
        target = [observed_gradient(observation, n).float().to(self.device) for n in names]
        body = model.extractor
        assert isinstance(body, TransformerBody)
        vocabulary, length = body.embedding.num_embeddings, observation.input_spec.image_size
        generator = torch.Generator().manual_seed(seed)
        shape = (observation.num_examples, length + 1, vocabulary)
        logits = (torch.randn(shape, generator=generator) * params.init_scale).to(self.device)
        logits.requires_grad_(True)
        optimiser = torch.optim.Adam([logits], lr=params.lr)
        trace: list[float] = []
        for step in range(1, params.steps + 1):
            optimiser.zero_grad()
            distance = self._distance(model, names, target, logits)
            distance.backward()
            optimiser.step()
            trace.append(float(distance.detach()))
            self.report_progress(step, params.steps, distance)
        tokens = logits.detach()[:, :-1].argmax(-1).cpu()
        return Reconstruction(
            images=tokens,
            labels=torch.zeros(len(tokens), dtype=torch.long),
            objective_trace=trace,
            iterations=params.steps,
            steps_taken=params.steps,
            converged=False,
            final_objective=trace[-1],
            seconds=time.perf_counter() - start,
            details={"stop_reason": "budget", "one_step": one_step(observation)},
        )

    def _distance(
        self,
        model: SplitNet,
        names: list[str],
        target: list[torch.Tensor],
        logits: torch.Tensor,
    ) -> torch.Tensor:
        """TAG's distance between the soft batch's gradient and the observed one (attention
        by the math kernel: the fused kernels have no second derivative)."""
        named = dict(model.named_parameters())
        soft, body = logits.softmax(-1), model.extractor
        assert isinstance(body, TransformerBody)
        with sdpa_kernel(SDPBackend.MATH):
            out = model.classifier(soft_forward(body, soft[:, :-1]))
            loss = -(soft[:, 1:] * out.log_softmax(-1)).sum(-1).mean()
            grads = torch.autograd.grad(loss, [named[n] for n in names], create_graph=True)
        alpha = self.params.alpha
        return torch.stack(
            [
                (g - t).square().sum() + alpha * (g - t).abs().sum()
                for g, t in zip(grads, target, strict=True)
            ]
        ).sum()
