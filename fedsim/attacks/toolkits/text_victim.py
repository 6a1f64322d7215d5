"""What an attack on a text client's upload reads: the sent transformer and its gradients.

Shared by the text reconstruction attacks (``dager``, ``tag``): the model rebuilt from
the global parameters the server sent, the observed gradient of a parameter (a probe's
gradient, or an update read as one SGD step), and the one-line applicability check
(a causal transformer whose attention layers are uploaded, a batch below the rank limit).
"""

from __future__ import annotations

import torch
from torch import nn

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.toolkits.gradients import local_steps_taken
from fedsim.core.config import require
from fedsim.core.data import DATASETS
from fedsim.core.models import SplitNet, build_model
from fedsim.core.threat import SharedKind, ThreatModel
from fedsim.text.dager import token_limit
from fedsim.text.models import attention_weight_name, attention_width


def sent_model(observation: Observation, device: torch.device) -> SplitNet:
    """The model as the server sent it (eval mode, on ``device``)."""
    model = build_model(observation.model, observation.input_spec)
    model.load_state_dict(observation.global_params, strict=False)
    return model.to(device).eval()


def observed_gradient(observation: Observation, name: str) -> torch.Tensor:
    """Parameter ``name``'s gradient as the server reads it: the probe's, or an update
    read as one SGD step (``(sent - received) / lr``; exact only for one local step)."""
    shared = observation.shared[name].double()
    if observation.shared_kind == SharedKind.GRADIENT:
        return shared
    sent = observation.global_params[name].double()
    return (sent - shared) / observation.train_config.lr


def one_step(observation: Observation) -> bool:
    """Whether the observation is one gradient step (a probe, or a one-step SGD update)."""
    if observation.shared_kind == SharedKind.GRADIENT:
        return True
    cfg = observation.train_config
    return local_steps_taken(observation) == 1 and cfg.optimizer == "sgd"


def window_length(setting: AttackSetting) -> int | None:
    """The tokens a model of ``setting``'s data reads per sequence (``None``: not text)."""
    spec = getattr(DATASETS.get(setting.data.dataset), "input_spec", None)
    return None if spec is None else int(spec().image_size)


def check_text_setting(setting: AttackSetting, key: str, name: str) -> None:
    """One line refusing a setting an attack on a causal transformer's first attention
    layers cannot read: another model, attention layers not uploaded, an update by Adam or
    momentum (full rank from the first step), a batch whose tokens reach the rank limit of
    the width (:func:`fedsim.text.dager.token_limit`). ``tag`` is held to the same rules so
    that both run on the same victims (beyond the limit it recovered nothing either)."""
    width = attention_width(setting.model.name)
    require(
        width is not None,
        f"{key}.name",
        name,
        f"reads the attention-weight gradients of a causal transformer (word-transformer); "
        f"model {setting.model.name!r} has no attention layer",
    )
    assert width is not None
    uploads = setting.uploads
    for layer in (0, 1):
        wanted = attention_weight_name(layer)
        require(
            uploads is None or any(wanted.startswith(p) for p in uploads),
            f"{key}.name",
            name,
            f"reads {wanted}; strategy {setting.strategy!r} does not upload it",
        )
    probe = setting.threat_model == ThreatModel.PROBE
    client = setting.client
    require(
        probe or (client.optimizer == "sgd" and client.momentum == 0),
        f"{key}.name",
        name,
        f"reads an update as plain SGD steps; client.optimizer = {client.optimizer!r}"
        f"{f' with momentum {client.momentum:g}' if client.momentum else ''} rescales each "
        "coordinate, which makes the update full-rank from its first step "
        '(docs/text-reconstruction.md); use threat-model = "probe" or plain-SGD clients',
    )
    length = window_length(setting)
    batch = setting.probe_batch_size if probe else setting.client.batch_size
    if length is None:
        return
    limit = token_limit(width)
    where = "audit.probe-batch-size" if probe else "client.batch-size"
    require(
        batch * length < limit,
        f"{key}.name",
        name,
        f"a batch of {batch} x {length} tokens ({where}) reaches the rank limit of the "
        f"model's width {width} ({limit} tokens): the gradient's span tells nothing",
    )


def first_layers_gradients(observation: Observation) -> tuple[torch.Tensor, torch.Tensor]:
    """Layers 0 and 1's stacked q, k, v weight gradients, as the server reads them."""
    first, second = (observed_gradient(observation, attention_weight_name(i)) for i in (0, 1))
    return first, second


def body_of(model: nn.Module) -> nn.Module:
    """The transformer body (the split model's extractor)."""
    return model.extractor  # type: ignore[return-value]
