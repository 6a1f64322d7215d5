"""Data-free knowledge distillation: FedCG's server step (Wu et al. 2022, Algorithm 2).

Codes ``(z, y)``, ``y ~ U{0..c-1}`` and ``z ~ N(0, 1)``, replace data. The
teacher is the data-weighted ensemble of the clients' pairs,
``p = softmax(sum_i w_i C_i(G_i(z, y)))``; the student is the global pair,
``q = log_softmax(C_g(G_g(z, y)))``; Adam minimises ``KL(p || q)`` over the
student's generator and classifier. By default every network runs in eval
mode: the generators' BatchNorm layers use their running statistics, as
clients use the global generator in stage 1 (and as the audit would), and
distillation leaves those statistics as the weighted average set them. The
FedCG code trains the student in train mode instead (``train_mode``; its
``protocol = "paper"``), without the gate below.

The server keeps the distilled pair only when it lowers the KL on held-out
codes (:func:`distill_if_better`): the student starts at the weighted
average, often already close to the ensemble, and a fresh Adam's first steps
move every parameter by about ``lr`` whatever the gradient, so a short
distillation can end above where it started (on FMNIST(4), 200 iterations of
lr 3e-4 raised the KL from round 3 on, e.g. 0.0056 -> 0.031 in round 6).
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


@dataclass(frozen=True)
class DistillOutcome:
    """Teacher-student KL on held-out codes before and after one distillation."""

    kl_before: float
    kl_distilled: float
    always_kept: bool = False  # no gate: the distilled pair replaces the average regardless

    @property
    def accepted(self) -> bool:
        """Whether the distilled pair replaced the averaged one."""
        return self.always_kept or self.kl_distilled < self.kl_before

    @property
    def kl_after(self) -> float:
        """The KL of the pair kept."""
        return self.kl_distilled if self.accepted else self.kl_before


def distill_if_better(
    student: GanSplitNet,
    teachers: Sequence[Teacher],
    held_out: tuple[torch.Tensor, torch.Tensor],
    iterations: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> DistillOutcome:
    """:func:`distill` ``student``, then undo it unless the KL on ``held_out`` codes fell."""
    z, y = held_out
    before = teacher_student_kl(student, teachers, z, y)
    start = {k: v.clone() for k, v in student.state_dict().items()}
    distill(student, teachers, iterations, batch_size, lr, seed)
    outcome = DistillOutcome(before, teacher_student_kl(student, teachers, z, y))
    if not outcome.accepted:
        student.load_state_dict(start)
    return outcome


def distill(
    student: GanSplitNet,
    teachers: Sequence[Teacher],
    iterations: int,
    batch_size: int,
    lr: float,
    seed: int,
    optimizer: torch.optim.Optimizer | None = None,
    train_mode: bool = False,
) -> float:
    """Train ``student``'s generator and classifier in place; return the mean KL.

    ``optimizer``: an Adam over the student's generator and classifier whose
    state carries over from earlier rounds (``bench/fedcg_distillation.py
    --compare`` measures that against a fresh Adam behind the gate); default: a
    fresh Adam at ``lr``. ``train_mode``: the student in train mode, as the
    FedCG code runs it (its generator's BatchNorm normalises by each batch of
    codes and moves its running statistics); default: eval mode.
    """
    student.train(train_mode)
    params = [*student.generator.parameters(), *student.classifier.parameters()]
    optimizer = optimizer or torch.optim.Adam(params, lr=lr)
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(iterations):
        z, y = sample_codes(batch_size, student, generator)
        loss = kl_loss(ensemble_logits(teachers, z, y), _logits(student, z, y))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += float(loss.detach())
    student.eval()
    return total / max(1, iterations)
