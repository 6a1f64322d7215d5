"""What the output-layer readers among the leak analyses share (``llg``, ``logit-shift``,
``class-representatives``, ``generator-representatives``, ``shadow-labels``).

:func:`check_output_layer` refuses a setting whose server never sees the output layer's
bias; :func:`check_logit_reader` also needs the whole model's update and a held-out
split, for comparing logits on the server's public data; :func:`public_subset` draws
public examples with a given class mix, :func:`public_class_means` the public class-mean
images (a representatives analysis's start, and the bar it must clear).
"""

from __future__ import annotations

import numpy as np
import torch

from fedsim.attacks.base import AttackSetting, PublicData
from fedsim.attacks.toolkits.closed_form import linear_layers, setting_model, uploaded
from fedsim.core.config import require
from fedsim.core.data import Normalization


def check_output_layer(setting: AttackSetting, key: str, name: str) -> str:
    """The output layer's name prefix, refusing a setting whose server never sees its bias."""
    model = setting_model(setting)
    prefix, layer = linear_layers(model)[-1]
    require(
        layer.bias is not None and uploaded(f"{prefix}.bias", setting.uploads),
        f"{key}.name",
        name,
        f"reads the output layer's bias; model {setting.model.name!r} under strategy "
        f"{setting.strategy!r} uploads no {prefix}.bias",
    )
    return prefix


def check_logit_reader(
    setting: AttackSetting,
    key: str,
    name: str,
    public_use: str = "reads the logits' shift on the server's public data",
) -> None:
    """Refuse, for analysis ``name``, a setting without what reading the logits' shift
    needs: an uploaded output bias, the whole model's update, a held-out split
    (``public_use``: what ``name`` does with it, for the refusal's line)."""
    check_output_layer(setting, key, name)
    require(
        setting.uploads is None,
        f"{key}.name",
        name,
        "compares the uploaded model's logits with the sent one's: needs the whole "
        f"model's update (strategy {setting.strategy!r} shares only part of it)",
    )
    require(
        setting.held_out,
        f"{key}.name",
        name,
        f"{public_use}; dataset "
        f"{setting.data.dataset!r} has no held-out split (generated, or its test images "
        "are its training images)",
    )


def public_subset(public: PublicData, labels: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """Indices of public examples with exactly ``labels``' classes (drawn with replacement
    within a class when it holds fewer than asked)."""
    pool = public.labels.cpu().numpy()
    chosen = []
    for cls, count in zip(*np.unique(labels, return_counts=True), strict=True):
        own = np.flatnonzero(pool == cls)
        if len(own) == 0:
            raise ValueError(f"the server's public data holds no example of class {cls}")
        chosen.append(rng.choice(own, count, replace=count > len(own)))
    return torch.from_numpy(np.concatenate(chosen))


def public_class_means(
    public: PublicData, classes: torch.Tensor, normalization: Normalization
) -> torch.Tensor:
    """The public class-mean image of each of ``classes`` in pixel space [0, 1], ``(m, C,
    H, W)``: what the server knows of a class without any upload. A class the public data
    lacks gets the mean of every public image."""
    pixels = normalization.to_pixels(public.images.cpu()).clamp(0, 1)
    labels = public.labels.cpu()
    means = [
        pixels[labels == c].mean(dim=0) if bool((labels == c).any()) else pixels.mean(dim=0)
        for c in classes.cpu().tolist()
    ]
    return torch.stack(means) if means else pixels[:0]
