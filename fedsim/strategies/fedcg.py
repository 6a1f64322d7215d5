"""FedCG (Wu et al. 2022): shared classifier and generator, distilled without data.

Each round the server averages the clients' uploaded classifiers and
generators by data size (FedAvg's aggregate over both), then refines that
pair by data-free knowledge distillation from the clients' own pairs
(:mod:`fedsim.strategies.distillation`). Clients run the two-stage update of
:mod:`fedsim.clients.fedcg`; evaluation is personalised as in FedSplit, and there is
no global model to test on the held-out set.

Message layout (what the server sends and receives; the privacy audit reads
exactly this). Array names are :class:`~fedsim.core.gan.GanSplitNet` state-dict
names; rebuild them with :func:`fedsim.core.gan.build_gan_split_net` (or
:func:`fedsim.core.gan.build_generator` for ``generator.*`` with the prefix
stripped) and ``load_state_dict``.

- Train and evaluate messages, ``arrays``: the global classifier C_g
  (``classifier.*``) and the global generator G_g (``generator.*``, its
  BatchNorm running statistics included). Train ``config`` adds the public
  ``fedcg-gamma`` (this round's stage-1 weight), ``fedcg-diversity-weight``,
  ``fedcg-gan-steps`` and ``fedcg-protocol``.
- Train replies, ``arrays``: the client's classifier C_i and generator G_i
  under the same names; ``metrics``: ``num-examples`` (the aggregation
  weight), ``train-loss``, ``gan-d-loss``, ``gan-g-loss``, ``partition-id``.
- Never in a message: ``extractor.*`` and ``discriminator.*``.

Pass ``network=`` so the server can rebuild the clients' pairs, and ``seed=``
(the distillation's streams derive from it); fedsim's runner passes the
scenario's (:meth:`FedCG.server_arguments`), a Flower ServerApp its own, with
the initial arrays (``classifier.*`` and ``generator.*`` of such a network,
:meth:`initial_arrays`) to ``start``.

Round metrics added by the server (:mod:`fedsim.core.protocol`'s ``DISTILL_*``):
``distill-kl-before`` (teacher-student KL of the weighted average on 256
fresh seeded codes, held out from distillation), ``distill-kl-distilled``
(the distilled pair's), ``distill-accepted`` (1 when the distilled pair
lowered that KL and replaced the average, else 0), ``distill-kl-after`` (the
KL of the pair kept, never above ``distill-kl-before``) and
``distill-seconds``. See :func:`fedsim.strategies.distillation.distill_if_better`
for why the distilled pair is not always kept. Under ``protocol = "paper"``
(the authors' code) it always is, ``distill-kl-after`` may exceed
``-before``, and the server's Adam state carries over rounds and checkpoints.
``fedcg-gamma``: the round's stage-1 weight. The clients' train replies add
``fedcg-ce-loss`` and ``fedcg-mse`` (stage 1's terms, the MSE before gamma)
and ``local-val-acc`` / ``local-test-acc`` (their model right after training).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from fedsim.core import protocol
from fedsim.core.config import DataConfig, ModelConfig, ScenarioError, require
from fedsim.core.gan import GanSplitNet, build_gan_split_net, feature_shape
from fedsim.core.modality import IMAGE
from fedsim.core.models import InputSpec, build_model
from fedsim.core.seeds import SeedStream, derive_seed, model_init_seed
from fedsim.core.training import load_optimizer_tensors, optimizer_tensors
from fedsim.strategies.base import ServerResources
from fedsim.strategies.distillation import (
    DistillOutcome,
    Teacher,
    distill,
    distill_if_better,
    sample_codes,
    teacher_student_kl,
)
from fedsim.strategies.fedsplit import FedSplit
from fedsim.strategies.registry import STRATEGIES

PROBE_CODES = 256
PAPER_RAMP_ROUNDS = 50  # the authors' code: p = round / 50 at every budget
DISTILL_STATE = "distill-optimizer"  # the checkpoint's key for the kept server Adam


def gamma_schedule(server_round: int, ramp_rounds: int) -> float:
    """Stage-1 weight ``2 / (1 + exp(-10 p)) - 1``, ``p = min((round - 1) / ramp, 1)``.

    ``p`` counts the rounds finished before this one, so the first round,
    whose global generator is untrained, has ``gamma = 0``; ``gamma`` reaches
    0.9999 after ``ramp_rounds`` rounds (the paper: 50 of 100).
    """
    p = min((server_round - 1) / ramp_rounds, 1.0)
    return 2.0 / (1.0 + math.exp(-10.0 * p)) - 1.0


@dataclass(frozen=True)
class FedCGParams:
    """FedCG's server and schedule settings; defaults are the paper's.

    ``distill-iterations`` and ``distill-batch-size``: the server's
    distillation (paper: 2000 and 16; 0 iterations = plain averaging).
    ``distill-lr``: its Adam learning rate. ``gamma-ramp-rounds``: rounds for
    gamma to reach 1. ``diversity-weight``: weight of the clients' diversity
    loss (0 = off). ``gan-steps``: minibatches of the clients' GAN stage
    (0 = as many as stage 1, as in the paper). ``protocol``: ``"fedsim"``
    distils a fresh Adam's student in eval mode and keeps the result only when
    it lowers the KL on held-out codes, clients' GAN Adams take the client's
    weight decay; ``"paper"`` runs it as the FedCG code does: one server Adam
    kept across rounds (and in checkpoints), the student in train mode, no
    gate, GAN Adams without weight decay.
    """

    distill_iterations: int = 2000
    distill_batch_size: int = 16
    distill_lr: float = 3e-4
    gamma_ramp_rounds: int = 50
    diversity_weight: float = 0.2
    gan_steps: int = 0
    protocol: Literal["fedsim", "paper"] = "fedsim"

    def __post_init__(self) -> None:
        require(
            self.protocol in ("fedsim", "paper"),
            "protocol",
            self.protocol,
            'allowed: "fedsim", "paper"',
        )
        require(
            self.distill_iterations >= 0,
            "distill-iterations",
            self.distill_iterations,
            "must be >= 0",
        )
        require(
            self.distill_batch_size >= 1,
            "distill-batch-size",
            self.distill_batch_size,
            "must be >= 1",
        )
        require(self.distill_lr > 0, "distill-lr", self.distill_lr, "must be > 0")
        require(
            self.gamma_ramp_rounds >= 1, "gamma-ramp-rounds", self.gamma_ramp_rounds, "must be >= 1"
        )
        require(
            self.diversity_weight >= 0, "diversity-weight", self.diversity_weight, "must be >= 0"
        )
        require(self.gan_steps >= 0, "gan-steps", self.gan_steps, "must be >= 0")


@STRATEGIES.register("fedcg")
class FedCG(FedSplit):
    """FedSplit's averaging over classifier and generator, then distillation."""

    Params: ClassVar[type] = FedCGParams
    client_routine: ClassVar[str] = "fedcg"
    modality: ClassVar[str] = IMAGE  # its generators draw feature maps per class label
    shared_prefixes: ClassVar[tuple[str, ...]] = protocol.FEDCG_SHARED
    weighted_mean: ClassVar[bool] = False  # the server distils from each client's generator
    plain_mean: ClassVar[bool] = False

    def __init__(
        self,
        distill_iterations: int = 2000,
        distill_batch_size: int = 16,
        distill_lr: float = 3e-4,
        gamma_ramp_rounds: int = 50,
        diversity_weight: float = 0.2,
        gan_steps: int = 0,
        protocol: Literal["fedsim", "paper"] = "fedsim",
        *,
        network: Callable[[], GanSplitNet] | None = None,
        seed: int = 0,
        **flower_options: Any,
    ) -> None:
        """FedCG's hyper-parameters (:class:`FedCGParams`), then ``network`` (builds an
        untrained classifier + generator pair of the clients' architecture) and ``seed``
        (of the distillation's streams); ``flower_options`` are Flower's ``FedAvg``
        arguments."""
        super().__init__(network=network, **flower_options)
        self.params = FedCGParams(
            distill_iterations,
            distill_batch_size,
            distill_lr,
            gamma_ramp_rounds,
            diversity_weight,
            gan_steps,
            protocol,
        )
        self.seed = seed
        # protocol "paper": the server Adam's state, carried from round to round.
        self.distill_state: dict[str, torch.Tensor] = {}

    @classmethod
    def check_model(cls, model: ModelConfig, data: DataConfig) -> None:
        # The extractor's output shape does not depend on the input channels.
        spec = InputSpec(1, data.image_size, 2)
        try:
            feature_shape(build_model(model, spec).extractor, spec)
        except ValueError as err:
            raise ScenarioError("model.name", model.name, str(err)) from None

    @classmethod
    def server_arguments(cls, server: ServerResources) -> dict[str, Any]:
        """The seeded classifier + generator pair on the server's device, and the
        federation's seed."""
        seed = server.seed

        def network() -> GanSplitNet:
            spec, model = server.input_spec, server.model_config
            return build_gan_split_net(model, spec, model_init_seed(seed)).to(server.device)

        return {"network": network, "seed": seed}

    @classmethod
    def departures(cls, params: Any) -> tuple[str, ...]:
        """A gamma ramp shorter than the authors' 50 rounds, said in the run's summary."""
        ramp = cast(FedCGParams, params).gamma_ramp_rounds
        if ramp >= PAPER_RAMP_ROUNDS:
            return ()
        return (
            f"FedCG's gamma ramp is compressed: gamma-ramp-rounds = {ramp}, so gamma reaches 1 "
            f"after {ramp} rounds where the authors' code takes {PAPER_RAMP_ROUNDS} "
            f"(p = round / {PAPER_RAMP_ROUNDS}); a compressed ramp kept FedCG's clients "
            "at chance at small budgets (docs/strategies.md)",
        )

    def network(self, arrays: ArrayRecord | None = None) -> GanSplitNet:
        """A classifier + generator pair on the server, loaded with ``arrays`` (may be partial)."""
        return cast(GanSplitNet, super().network(arrays))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config[protocol.FEDCG_GAMMA] = gamma_schedule(server_round, self.params.gamma_ramp_rounds)
        config[protocol.FEDCG_DIVERSITY] = self.params.diversity_weight
        config[protocol.FEDCG_GAN_STEPS] = self.params.gan_steps
        config[protocol.FEDCG_PROTOCOL] = self.params.protocol
        return super().configure_train(server_round, arrays, config, grid)

    def state_for_checkpoint(self) -> dict[str, Any]:
        return super().state_for_checkpoint() | {DISTILL_STATE: dict(self.distill_state)}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        super().restore_checkpoint_state(state)
        self.distill_state = dict(state.get(DISTILL_STATE, {}))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Weighted average of the pairs, then distillation from the clients' pairs if it helps."""
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None or metrics is None:
            return arrays, metrics
        contents = [r.content for r in replies if not r.has_error()]
        sizes = [protocol.read_float(c[protocol.METRICS], protocol.NUM_EXAMPLES) for c in contents]
        teachers = [
            Teacher(n / sum(sizes), self.network(c[protocol.ARRAYS]))  # type: ignore[arg-type]
            for n, c in zip(sizes, contents, strict=True)
        ]
        student = self.network(arrays)
        seed = self.seed
        probe_seed = derive_seed(SeedStream.DISTILL_PROBE, seed, server_round)
        held_out = sample_codes(PROBE_CODES, student, torch.Generator().manual_seed(probe_seed))
        started = time.perf_counter()
        distill_seed = derive_seed(SeedStream.DISTILL, seed, server_round)
        if self.params.protocol == "paper":
            outcome = self.distill_kept_adam(student, teachers, held_out, distill_seed)
        else:
            outcome = distill_if_better(
                student,
                teachers,
                held_out,
                self.params.distill_iterations,
                self.params.distill_batch_size,
                self.params.distill_lr,
                distill_seed,
            )
        metrics[protocol.DISTILL_SECONDS] = time.perf_counter() - started
        metrics[protocol.FEDCG_GAMMA] = gamma_schedule(server_round, self.params.gamma_ramp_rounds)
        metrics[protocol.DISTILL_KL_BEFORE] = outcome.kl_before
        metrics[protocol.DISTILL_KL_DISTILLED] = outcome.kl_distilled
        metrics[protocol.DISTILL_KL_AFTER] = outcome.kl_after
        metrics[protocol.DISTILL_ACCEPTED] = int(outcome.accepted)
        return ArrayRecord(
            protocol.keep_prefixed(student.state_dict(), self.shared_prefixes)
        ), metrics

    def distill_kept_adam(
        self,
        student: GanSplitNet,
        teachers: list[Teacher],
        held_out: tuple[torch.Tensor, torch.Tensor],
        seed: int,
    ) -> DistillOutcome:
        """The FedCG code's server step: the student in train mode, one Adam whose state
        carries over rounds, the result always kept (the held-out KL is only reported)."""
        z, y = held_out
        before = teacher_student_kl(student, teachers, z, y)
        params = [*student.generator.parameters(), *student.classifier.parameters()]
        optimizer = torch.optim.Adam(params, lr=self.params.distill_lr)
        load_optimizer_tensors(optimizer, self.distill_state, DISTILL_STATE)
        distill(
            student,
            teachers,
            self.params.distill_iterations,
            self.params.distill_batch_size,
            self.params.distill_lr,
            seed,
            optimizer=optimizer,
            train_mode=True,
        )
        self.distill_state = optimizer_tensors(optimizer, DISTILL_STATE)
        after = teacher_student_kl(student, teachers, z, y)
        return DistillOutcome(before, after, always_kept=True)
