"""A client's defences in order: resolved once, checked, and applied to its upload, its
training and its probe gradient."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord

from fedsim.clients.base import ClientEnv, ClientRoutine, ClientSpec
from fedsim.clients.defences.base import (
    DEFENCES,
    Defence,
    ProbeContext,
    Tensors,
)
from fedsim.core import protocol
from fedsim.core.components import Resolved, resolve
from fedsim.core.config import ComponentConfig, require
from fedsim.core.seeds import SeedStream, stream_rng
from fedsim.core.training import TRAINING_HOOK


def resolve_defences(defences: tuple[ComponentConfig, ...]) -> tuple[Resolved, ...]:
    """A scenario's ``[[defences]]``, in order, each resolved into its class and
    validated parameters (once, by validation; clients receive them in their spec)."""
    return tuple(resolve(DEFENCES, cfg, f"defences[{i}]") for i, cfg in enumerate(defences))


def defence_chain(client: ClientSpec) -> list[Defence]:
    """The client's defences, in order, built from their resolved parameters."""
    return [resolved.create() for resolved in client.defences]


def check_defences(client: ClientSpec, strategy: str) -> None:
    """The client's defences fit it and ``strategy`` (combinations, the model; against the
    audit's threat model: :func:`fedsim.scenario.applicability.check_defence_threat`)."""
    for resolved, defence in zip(client.defences, defence_chain(client), strict=True):
        defence.check(client, strategy, resolved.key)
    names = [d.name for d in client.defences]
    require(names.count("dp-sgd") <= 1, "defences", names, "list dp-sgd at most once")


def protect_upload(
    chain: list[Defence],
    sent: ArrayRecord,
    reply: ArrayRecord,
    parameter_names: set[str],
    rng: np.random.Generator,
) -> ArrayRecord:
    """``reply`` with the update of each trainable parameter passed through ``chain``.

    The update is ``reply - sent`` for tensors the server sent, the tensor
    itself otherwise.
    """
    received = sent.to_torch_state_dict()
    uploaded = dict(reply.to_torch_state_dict())
    names = [k for k in uploaded if k in parameter_names and uploaded[k].is_floating_point()]
    update = {k: uploaded[k] - received[k] if k in received else uploaded[k] for k in names}
    computed = dict(update)
    for defence in chain:
        update = defence.protect(update, rng)
    for k in names:
        if update[k] is not computed[k]:  # untouched: the upload as trained, bit for bit
            uploaded[k] = update[k] + received[k] if k in received else update[k]
    return ArrayRecord(uploaded)


def train_defended(
    routine: ClientRoutine, env: ClientEnv, sent: ArrayRecord, config: ConfigRecord
) -> tuple[ArrayRecord, dict[str, Any]]:
    """Run ``routine.train`` under the scenario's defences (the client app's train handler)."""
    chain = defence_chain(env.spec)
    if not chain:
        return routine.train(env, sent, config)
    server_round = protocol.read_int(config, protocol.SERVER_ROUND)
    hooks = [h for h in (d.training(env, server_round) for d in chain) if h is not None]
    token = TRAINING_HOOK.set(hooks[0] if hooks else None)
    try:
        arrays, metrics = routine.train(env, sent, config)
    finally:
        TRAINING_HOOK.reset(token)
    names = {n for n, _ in routine.build(env, sent).named_parameters()}
    rng = stream_rng(SeedStream.DEFENCE_UPLOAD, env.spec.seed, server_round, env.partition_id)
    arrays = protect_upload(chain, sent, arrays, names, rng)
    for hook in hooks:
        hook.save()
        metrics[protocol.DP_EPSILON] = hook.epsilon()
    return arrays, metrics


def protect_probe(
    client: ClientSpec,
    gradient: Tensors,
    batch_size: int,
    server_round: int,
    partition: int,
    context: ProbeContext | None = None,
) -> Tensors:
    """The probe gradient as a client with its defences would share it (``context``: the
    probed batch and the model at the sent weights, for defences that read them)."""
    rng = stream_rng(SeedStream.DEFENCE_PROBE, client.seed, server_round, partition)
    for defence in defence_chain(client):
        gradient = defence.protect_gradient(gradient, batch_size, rng, context)
    return gradient
