"""Data-free knowledge distillation: FedCG's server step (Wu et al. 2022, Algorithm 2).

Codes ``(z, y)``, ``y ~ U{0..c-1}`` and ``z ~ N(0, 1)``, replace data. The
teacher is the data-weighted ensemble of the clients' pairs,
``p = softmax(sum_i w_i C_i(G_i(z, y)))``; the student is the global pair,
``q = log_softmax(C_g(G_g(z, y)))``; Adam minimises ``KL(p || q)`` over the
student's generator and classifier. Every network runs in eval mode: the
generators' BatchNorm layers use their running statistics, as clients use
the global generator in stage 1 (and as the audit would), and distillation
leaves those statistics as the weighted average set them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedsim.core.gan import GanSplitNet


@dataclass(frozen=True)
class Teacher:
    """One client's uploaded pair and its weight (its share of the data)."""

    weight: float
    net: GanSplitNet

    def __post_init__(self) -> None:
        self.net.eval()  # teachers only infer


def sample_codes(
    count: int, net: GanSplitNet, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` codes for ``net``'s generator: ``z ~ N(0, 1)``, ``y ~ U{0..c-1}``."""
    y = torch.randint(0, net.generator.num_classes, (count,), generator=generator)
    z = torch.randn(count, net.generator.noise_dim, generator=generator)
    device = next(net.parameters()).device
    return z.to(device), y.to(device)


def _logits(net: GanSplitNet, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return net.classifier(net.generator(z, y))


@torch.no_grad()
def ensemble_logits(teachers: Sequence[Teacher], z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``sum_i w_i C_i(G_i(z, y))``: the teacher's logits."""
    return torch.stack([t.weight * _logits(t.net, z, y) for t in teachers]).sum(dim=0)


def kl_loss(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(teacher) || softmax(student))``, mean over the batch."""
    return F.kl_div(
        F.log_softmax(student_logits, dim=1),
        F.softmax(teacher_logits, dim=1),
        reduction="batchmean",
    )


@torch.no_grad()
def teacher_student_kl(
    student: GanSplitNet, teachers: Sequence[Teacher], z: torch.Tensor, y: torch.Tensor
) -> float:
    """The distillation objective on given codes, without training."""
    student.eval()
    return float(kl_loss(ensemble_logits(teachers, z, y), _logits(student, z, y)))


def distill(
    student: GanSplitNet,
    teachers: Sequence[Teacher],
    iterations: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> float:
    """Train ``student``'s generator and classifier in place; return the mean KL."""
    student.eval()
    params = [*student.generator.parameters(), *student.classifier.parameters()]
    optimizer = torch.optim.Adam(params, lr=lr)
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(iterations):
        z, y = sample_codes(batch_size, student, generator)
        loss = kl_loss(ensemble_logits(teachers, z, y), _logits(student, z, y))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += float(loss.detach())
    return total / max(1, iterations)
