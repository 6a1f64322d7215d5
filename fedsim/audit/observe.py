"""Observations from what the server holds: sent model and config, received reply.

Nothing here touches client data. Which tensors are "the model" is decided by
the architecture: reply arrays whose names are model parameters go into
``shared``; anything else a strategy uploads (FedCG's ``generator.*``) goes
into ``extra_uploads`` and what the server sent besides the model into
``extra_sent``; of the sent config, the client config and FedProx's mu.
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

from fedsim.attacks.base import Observation, SharedKind, ThreatModel
from fedsim.core import protocol
from fedsim.core.config import ClientConfig, ModelConfig
from fedsim.core.data import Normalization
from fedsim.core.models import InputSpec, batch_statistics, build_model
from fedsim.core.training import examples_touched
from fedsim.core.truth import GroundTruth


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
        server_round: int,
        client_id: int,
        threat_model: ThreatModel,
        shared: dict[str, torch.Tensor],
        sent: dict[str, torch.Tensor],
        train_config: ClientConfig,
        num_examples: int,
        proximal_mu: float = 0.0,
        uploads: dict[str, torch.Tensor] | None = None,
        shared_kind: SharedKind | None = None,
    ) -> Observation:
        """The one way an :class:`Observation` is built: ``shared`` as received (the
        probe's gradients, or the reply's model tensors), ``sent`` the server's whole
        state, split here into the model's parameters and the rest. ``shared_kind``
        defaults to what the threat model shares (a probe's gradients, a reply's update)."""
        names = self.parameter_names
        return Observation(
            round=server_round,
            client_id=client_id,
            threat_model=threat_model,
            shared_kind=shared_kind or ("gradient" if threat_model == "probe" else "update"),
            shared=shared,
            global_params={k: v for k, v in sent.items() if k in names},
            model=self.model,
            input_spec=self.input_spec,
            normalization=self.normalization,
            train_config=train_config,
            num_examples=num_examples,
            strategy=self.strategy,
            proximal_mu=proximal_mu,
            extra_uploads=dict(uploads or {}),
            extra_sent={k: v for k, v in sent.items() if k not in names},
        )


def _tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in record.to_torch_state_dict().items()}


def observe_reply(
    view: ServerView,
    server_round: int,
    sent_arrays: ArrayRecord,
    sent_config: ConfigRecord,
    train_config: ClientConfig,
    reply: Message,
    threat_model: ThreatModel,
    probe_gradient: dict[str, torch.Tensor] | None = None,
    probe_batch_size: int = 0,
) -> Observation:
    """What the server saw of one client in one round.

    ``train_config`` is ``sent_config`` read as a client config. For the
    ``update`` threat model ``shared`` is the client's uploaded model tensors;
    for ``probe`` it is ``probe_gradient`` (one batch's gradient at the sent
    model, on the same shared names) and ``num_examples`` is that batch's size.
    """
    names = view.parameter_names
    uploaded = _tensors(reply.content[protocol.ARRAYS])  # type: ignore[arg-type]
    shared = {k: v for k, v in uploaded.items() if k in names}
    uploads = {k: v for k, v in uploaded.items() if k not in names}
    metrics = reply.content[protocol.METRICS]
    # The examples the upload was computed on (public: reported size, batch, steps).
    num_examples = examples_touched(protocol.read_int(metrics, protocol.NUM_EXAMPLES), train_config)
    if threat_model == "probe":
        assert probe_gradient is not None, "a probe observation needs the probe gradient"
        shared = {k: probe_gradient[k] for k in shared}
        num_examples = probe_batch_size
    return view.observe(
        server_round,
        protocol.read_int(metrics, protocol.PARTITION_ID),
        threat_model,
        shared,
        _tensors(sent_arrays),
        train_config,
        num_examples,
        proximal_mu=float(sent_config.get(protocol.PROXIMAL_MU, 0.0)),  # type: ignore[arg-type]
        uploads=uploads,
    )


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
