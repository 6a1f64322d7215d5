"""Observations from what the server holds: sent model and config, received reply.

Nothing here touches client data. Which tensors are "the model" is decided by
the architecture: reply arrays whose names are model parameters go into
``shared``; anything else a strategy uploads (FedCG's ``generator.*``) goes
into ``extra_uploads`` and what the server sent besides the model into
``extra_sent``; of the sent config, the client config and FedProx's mu.
Under the ``aggregate`` threat model the server sees one observation a round, the
example-weighted mean of the replies (secure aggregation's view).
BatchNorm running buffers are not parameters: the server sees them in
``uploads`` exactly when the strategy uploads them (FedAvg and FedProx send
the whole state dict; FedSplit keeps the extractor's, hence its BatchNorm
layers', private), and what it sent in ``sent``; the attack's
``batchnorm`` knowledge decides how it uses them.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message

from fedsim.attacks.base import AGGREGATE_CLIENT, Observation
from fedsim.core import protocol
from fedsim.core.config import ClientConfig, ModelConfig
from fedsim.core.data import Normalization
from fedsim.core.models import InputSpec, batch_statistics, build_model
from fedsim.core.threat import SharedKind, ThreatModel
from fedsim.core.training import client_config_from_record, examples_touched
from fedsim.core.truth import GroundTruth


@dataclass(frozen=True)
class InterceptedReply:
    """One client's training reply, read once where it arrives.

    ``arrays``: every tensor it uploaded; ``config``: the client config it trained
    with (the round's, with a straggler's smaller ``local-epochs`` as its reply
    echoes it); ``examples_touched``: the examples its update was computed on
    (public: the reported size, the batch size and the steps).
    """

    partition: int
    reported_examples: int
    examples_touched: int
    config: ClientConfig
    arrays: dict[str, torch.Tensor]


@dataclass(frozen=True)
class InterceptedRound:
    """What the server sent in one training round and the replies it got back."""

    round: int
    sent: dict[str, torch.Tensor]
    config: ClientConfig
    proximal_mu: float
    replies: tuple[InterceptedReply, ...]

    def reply(self, partition: int) -> InterceptedReply:
        """The reply of client ``partition``."""
        return next(r for r in self.replies if r.partition == partition)

    def aggregate(self) -> dict[str, torch.Tensor]:
        """The example-weighted mean of every uploaded tensor: FedAvg's aggregate, and all
        that a server behind secure aggregation learns of the round's replies."""
        total = sum(r.reported_examples for r in self.replies)
        mean: dict[str, torch.Tensor] = {}
        for reply in self.replies:
            weight = reply.reported_examples / total
            for name, value in reply.arrays.items():
                mean[name] = mean[name] + weight * value if name in mean else weight * value
        return mean


def _tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in record.to_torch_state_dict().items()}


def intercept(
    server_round: int, sent_arrays: ArrayRecord, sent_config: ConfigRecord, replies: list[Message]
) -> InterceptedRound:
    """Read a round's sent model, config and replies once, for every analysis after."""
    config = client_config_from_record(sent_config)
    read = []
    for reply in replies:
        metrics = reply.content[protocol.METRICS]
        own = config
        if protocol.LOCAL_EPOCHS in metrics:  # a straggler trained fewer epochs
            own = dataclasses.replace(
                config, local_epochs=protocol.read_int(metrics, protocol.LOCAL_EPOCHS)
            )
        reported = protocol.read_int(metrics, protocol.NUM_EXAMPLES)
        read.append(
            InterceptedReply(
                partition=protocol.read_int(metrics, protocol.PARTITION_ID),
                reported_examples=reported,
                examples_touched=examples_touched(reported, own),
                config=own,
                arrays=_tensors(reply.content[protocol.ARRAYS]),  # type: ignore[arg-type]
            )
        )
    return InterceptedRound(
        server_round,
        _tensors(sent_arrays),
        config,
        float(sent_config.get(protocol.PROXIMAL_MU, 0.0)),  # type: ignore[arg-type]
        tuple(sorted(read, key=lambda r: r.partition)),
    )


@dataclass(frozen=True)
class ProbeGradient:
    """A probe: one batch's gradient at the sent model, as the client would share it."""

    gradient: dict[str, torch.Tensor]
    batch_size: int


@dataclass(frozen=True)
class ServerView:
    """What the server knows of the federation besides messages: all of it public.

    The architecture, the input pipeline and the strategy's name. It decides
    which uploaded tensors are "the model" (its trainable parameter names).
    """

    model: ModelConfig
    input_spec: InputSpec
    normalization: Normalization
    strategy: str

    @functools.cached_property
    def parameter_names(self) -> frozenset[str]:
        """Trainable parameter names of the architecture (no buffers)."""
        return frozenset(n for n, _ in build_model(self.model, self.input_spec).named_parameters())

    def observe(
        self,
        intercepted: InterceptedRound,
        reply: InterceptedReply,
        threat_model: ThreatModel,
        probe: ProbeGradient | None = None,
        shared_kind: SharedKind | None = None,
    ) -> Observation:
        """The one way an :class:`Observation` is built: what ``reply`` uploaded, or for
        the ``probe`` threat model ``probe``'s gradient on the same shared names (all the
        model's when the reply uploaded none). ``shared_kind`` defaults to what the threat
        model shares (a probe's gradients, a reply's update)."""
        threat_model = ThreatModel(threat_model)  # a scenario's name for it, too
        names = self.parameter_names
        shared = {k: v for k, v in reply.arrays.items() if k in names}
        num_examples = reply.examples_touched
        if threat_model == ThreatModel.PROBE:
            assert probe is not None, "a probe observation needs the probe gradient"
            wanted = shared or probe.gradient
            shared = {k: probe.gradient[k] for k in wanted if k in probe.gradient}
            num_examples = probe.batch_size
        sent = intercepted.sent
        return Observation(
            round=intercepted.round,
            client_id=reply.partition,
            threat_model=threat_model,
            shared_kind=shared_kind or threat_model.shared_kind,
            shared=shared,
            global_params={k: v for k, v in sent.items() if k in names},
            model=self.model,
            input_spec=self.input_spec,
            normalization=self.normalization,
            train_config=reply.config,
            num_examples=num_examples,
            strategy=self.strategy,
            proximal_mu=intercepted.proximal_mu,
            extra_uploads={k: v for k, v in reply.arrays.items() if k not in names},
            extra_sent={k: v for k, v in sent.items() if k not in names},
        )

    def observe_aggregate(self, intercepted: InterceptedRound) -> Observation:
        """The ``aggregate`` threat model's one observation of a round: the weighted mean
        of the replies (:meth:`InterceptedRound.aggregate`) observed as if one client had
        uploaded it, on all the examples the summed clients trained on."""
        touched = tuple(r.examples_touched for r in intercepted.replies)
        summed = InterceptedReply(
            partition=AGGREGATE_CLIENT,
            reported_examples=sum(r.reported_examples for r in intercepted.replies),
            examples_touched=sum(touched),
            config=intercepted.config,
            arrays=intercepted.aggregate(),
        )
        observation = self.observe(intercepted, summed, ThreatModel.AGGREGATE)
        return dataclasses.replace(observation, summed_examples=touched)


def observe_upload(
    view: ServerView,
    sent: dict[str, torch.Tensor],
    uploaded: dict[str, torch.Tensor],
    config: ClientConfig,
    examples: int,
    threat_model: ThreatModel = ThreatModel.UPDATE,
    probe: ProbeGradient | None = None,
) -> Observation:
    """One client's reply in round 1 observed outside a run (a test's, a bench's), by
    :meth:`ServerView.observe` as the audit observes it: client 0 trained on ``examples``
    examples with ``config`` from ``sent`` and uploaded ``uploaded``."""
    reply = InterceptedReply(0, examples, examples, config, uploaded)
    intercepted = InterceptedRound(1, sent, config, 0.0, (reply,))
    return view.observe(intercepted, reply, threat_model, probe)


def reveal_batch_statistics(observation: Observation, truth: GroundTruth) -> Observation:
    """``observation`` plus the victim batch's BatchNorm statistics (the ``known`` attacker).

    A deliberately stronger threat model (Huang et al. 2021): the statistics
    each BatchNorm layer used in a train-mode forward of the true batch at the
    sent model. Only an attack configured with ``batchnorm = "known"`` gets
    them, and its audit rows say ``known-batch``.
    """
    model = build_model(observation.model, observation.input_spec)
    state = {**observation.global_params, **observation.extra_sent}
    model.load_state_dict(state, strict=False)
    inputs = observation.normalization.to_model(truth.images.float())
    stats = batch_statistics(model, inputs)
    return dataclasses.replace(observation, batch_statistics=stats)
