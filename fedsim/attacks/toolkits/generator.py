"""FedCG's uploaded generator as the attacker rebuilds it (``aligned-dlg``,
``generator-representatives``).

Under FedCG a client uploads its conditional generator G_i (``generator.*``) beside its
classifier; :func:`check_generator_uploaded` refuses a setting whose clients upload none,
and :func:`uploaded_generator` rebuilds G_i from an observation.
"""

from __future__ import annotations

import torch

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.core import protocol
from fedsim.core.config import require
from fedsim.core.gan import ConditionalGenerator, build_generator


def check_generator_uploaded(setting: AttackSetting, key: str, name: str) -> None:
    """Refuse a setting whose clients upload no generator (only FedCG's do)."""
    require(
        setting.uploads is not None and protocol.GENERATOR in setting.uploads,
        f"{key}.name",
        name,
        "needs the clients' uploaded generator (strategy fedcg); "
        f"strategy {setting.strategy!r} uploads none",
    )


def uploaded_generator(
    observation: Observation, device: torch.device, name: str
) -> ConditionalGenerator:
    """The client's generator G_i rebuilt from its upload (``generator.*``), in eval mode
    (its uploaded BatchNorm running statistics)."""
    state = {
        k[len(protocol.GENERATOR) :]: v
        for k, v in observation.extra_uploads.items()
        if k.startswith(protocol.GENERATOR)
    }
    if not state:
        raise ValueError(
            f"{name} needs the client's generator (FedCG uploads 'generator.*'); "
            f"this observation from strategy {observation.strategy!r} has none"
        )
    # Every generator weight is then loaded: the build seed does not matter.
    generator = build_generator(observation.model, observation.input_spec)
    generator.load_state_dict(state)
    return generator.to(device).eval()
