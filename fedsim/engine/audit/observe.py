"""Observations from what the server holds: sent model and config, received reply.

Nothing here touches client data. Which tensors are "the model" is decided by
the architecture: reply arrays whose names are model parameters go into
``shared``; anything else a strategy uploads (FedCG's ``generator.*``) goes
into ``extras["uploads"]`` and what the server sent besides the model into
``extras["sent"]``; ``extras[protocol.CONFIG]`` is the whole public train config.
"""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message

from fedsim.attacks.base import Observation, ThreatModel
from fedsim.core import protocol
from fedsim.core.config import ClientConfig, Scenario
from fedsim.core.data import Normalization
from fedsim.core.models import InputSpec, build_model
from fedsim.core.training import client_config_from_record


def images_in_update(num_examples: int, cfg: ClientConfig) -> int:
    """How many distinct examples one round of local training touches."""
    if cfg.local_steps:
        return min(num_examples, cfg.batch_size * cfg.local_steps)
    return num_examples


def model_parameter_names(scenario: Scenario, spec: InputSpec) -> set[str]:
    """Trainable parameter names of the scenario's architecture (no buffers)."""
    return {name for name, _ in build_model(scenario.model, spec).named_parameters()}


def _tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in record.to_torch_state_dict().items()}


def public_config(config: ConfigRecord) -> dict[str, Any]:
    """The whole config the server sent (lr, steps, batch size, proximal mu, ...)."""
    return dict(config.items())


def observe_reply(
    scenario: Scenario,
    spec: InputSpec,
    normalization: Normalization,
    server_round: int,
    sent_arrays: ArrayRecord,
    sent_config: ConfigRecord,
    reply: Message,
    threat_model: ThreatModel,
    probe_gradient: dict[str, torch.Tensor] | None = None,
    probe_batch_size: int = 0,
) -> Observation:
    """What the server saw of one client in one round.

    For the ``update`` threat model ``shared`` is the client's uploaded model
    tensors; for ``probe`` it is ``probe_gradient`` (one batch's gradient at
    the sent model, on the same shared names) and ``num_examples`` is that
    batch's size.
    """
    names = model_parameter_names(scenario, spec)
    uploaded = _tensors(reply.content[protocol.ARRAYS])  # type: ignore[arg-type]
    shared = {k: v for k, v in uploaded.items() if k in names}
    uploads = {k: v for k, v in uploaded.items() if k not in names}
    metrics = reply.content[protocol.METRICS]
    train_config = client_config_from_record(sent_config)
    # The examples the upload was computed on (public: reported size, batch, steps).
    num_examples = images_in_update(int(metrics[protocol.NUM_EXAMPLES]), train_config)  # type: ignore[arg-type]
    if threat_model == "probe":
        assert probe_gradient is not None, "a probe observation needs the probe gradient"
        shared = {k: probe_gradient[k] for k in shared}
        num_examples = probe_batch_size
    sent = _tensors(sent_arrays)
    return Observation(
        round=server_round,
        client_id=int(metrics[protocol.PARTITION_ID]),  # type: ignore[arg-type]
        threat_model=threat_model,
        shared_kind="gradient" if threat_model == "probe" else "update",
        shared=shared,
        global_params={k: v for k, v in sent.items() if k in names},
        model=scenario.model,
        input_spec=spec,
        normalization=normalization,
        train_config=train_config,
        num_examples=num_examples,
        strategy=scenario.strategy.name,
        extras={
            protocol.CONFIG: public_config(sent_config),
            "uploads": uploads,
            "sent": {k: v for k, v in sent.items() if k not in names},
        },
    )
