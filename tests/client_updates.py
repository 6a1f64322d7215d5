"""A client's real multi-step update on real digits, as the server observes it (for tests)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from fedsim.attacks.base import Observation, PublicData
from fedsim.audit.observe import ServerView, observe_upload
from fedsim.core.config import ClientConfig, DataConfig, ModelConfig
from fedsim.core.data import DatasetBundle, load_dataset
from fedsim.core.models import InputSpec, build_model
from fedsim.core.training import train_local

CLIENT_SEED = 101  # the client's private shuffling seed: only the test knows it


def real_update(
    bundle: DatasetBundle,
    model_cfg: ModelConfig,
    cfg: ClientConfig,
    images: int,
    seed: int,
    public: PublicData | None = None,
) -> tuple[Observation, torch.Tensor, torch.Tensor]:
    """A client's update (fedsim's own ``train_local``) on ``images`` training digits of
    distinct classes, from a model drawn with ``seed``; its images (model space) and labels."""
    spec = InputSpec(bundle.channels, bundle.image_size, bundle.num_classes)
    idx = torch.tensor([7 + 397 * k + seed for k in range(images)])
    x, y = bundle.train_images[idx], bundle.train_labels[idx]
    model = build_model(model_cfg, spec, seed=seed)
    sent = {k: v.detach().clone() for k, v in model.named_parameters()}
    train_local(model, x, y, cfg, seed=CLIENT_SEED)
    observation = observed_update(model, sent, model_cfg, spec, bundle, cfg, images, public=public)
    return observation, x, y


def observed_update(
    model: torch.nn.Module,
    sent: dict[str, torch.Tensor],
    model_cfg: ModelConfig,
    spec: InputSpec,
    bundle: DatasetBundle,
    cfg: ClientConfig,
    num_examples: int,
    **fields: Any,
) -> Observation:
    """What the server observes of client 0 in round 1 after it trained ``model`` from
    ``sent``: the trained parameters as its update (``fields``: further Observation fields)."""
    view = ServerView(model_cfg, spec, bundle.normalization, "fedavg")
    uploaded = {k: v.detach().clone() for k, v in model.named_parameters()}
    observation = observe_upload(view, sent, uploaded, cfg, num_examples)
    return dataclasses.replace(observation, **fields)


@functools.cache
def embedded_digits() -> DatasetBundle:
    """The embedded MNIST digits, standardised."""
    return load_dataset(DataConfig(dataset="mnist-embedded", normalize=True))


@functools.cache
def public_digits() -> PublicData:
    """The server's public data: a seeded half of the held-out digits."""
    data = embedded_digits()
    order = torch.randperm(len(data.test_labels), generator=torch.Generator().manual_seed(0))
    half = order[: len(order) // 2]
    return PublicData(data.test_images[half], data.test_labels[half])
