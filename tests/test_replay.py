"""The attacker's differentiable replay of local training against the client's own code."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from fedsim.attacks.toolkits.gradients import soft_cross_entropy
from fedsim.attacks.toolkits.replay import local_batches, replay, replay_refusal
from fedsim.clients.fedprox import proximal_loss
from fedsim.core.config import ClientConfig, DataConfig, ModelConfig
from fedsim.core.data import load_dataset
from fedsim.core.models import InputSpec, build_model
from fedsim.core.training import batch_indices, cross_entropy_loss, train_local

BUNDLE = load_dataset(DataConfig())
SPEC = InputSpec(1, 32, 10)
MODEL = ModelConfig("lenet5-split", "default")
# 7 real digits of mixed classes, batches of 3: every epoch ends on a short batch.
INDEX = torch.tensor([5, 600, 1100, 1650, 2300, 3100, 3900])

CONFIGS = {
    "sgd": ClientConfig(local_epochs=2, batch_size=3, optimizer="sgd", lr=0.05),
    "momentum+wd": ClientConfig(
        local_epochs=2, batch_size=3, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3
    ),
    "adam": ClientConfig(local_epochs=2, batch_size=3, optimizer="adam", lr=3e-3),
    "adam+wd": ClientConfig(
        local_epochs=2, batch_size=3, optimizer="adam", lr=3e-3, weight_decay=1e-3
    ),
    "adamw": ClientConfig(
        local_epochs=2, batch_size=3, optimizer="adamw", lr=3e-3, weight_decay=1e-2
    ),
    "adam-steps": ClientConfig(local_steps=4, batch_size=3, optimizer="adam", lr=3e-3),
}


def _client_and_replay(cfg: ClientConfig, mu: float) -> tuple[float, float]:
    """The client's update by ``train_local`` and by the replay on the same batch schedule.

    Returns the largest absolute difference and the largest update entry.
    """
    images, labels = BUNDLE.train_images[INDEX], BUNDLE.train_labels[INDEX]
    model = build_model(MODEL, SPEC, seed=1)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = proximal_loss(model, mu) if mu else cross_entropy_loss
    train_local(model, images, labels, cfg, seed=11, loss_fn=loss)
    client = {n: p.detach() for n, p in model.named_parameters()}

    # The schedule the client drew (the test knows its seed; an attacker does not).
    order = list(batch_indices(len(labels), cfg, torch.Generator().manual_seed(11)))
    shapes = local_batches(len(labels), cfg)
    assert [len(i) for i in order] == [b.stop - b.start for b in shapes]
    net = build_model(MODEL, SPEC, seed=1)

    def grad(weights, x, y):
        return torch.func.grad(lambda w: soft_cross_entropy(functional_call(net, w, (x,)), y))(
            weights
        )

    replayed = replay(cfg, grad, start, [(images[i], labels[i]) for i in order], mu)
    diff = max(float((replayed[n] - client[n]).abs().max()) for n in start)
    moved = max(float((client[n] - start[n]).abs().max()) for n in start)
    return diff, moved


@pytest.mark.parametrize("name", list(CONFIGS))
def test_replay_reproduces_the_clients_update(name: str) -> None:
    diff, moved = _client_and_replay(CONFIGS[name], mu=0.0)

    assert moved > 1e-3  # the client really trained
    assert diff <= 1e-5 * max(1.0, moved) + 1e-6


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_replay_reproduces_fedprox_proximal_term(name: str) -> None:
    diff, moved = _client_and_replay(CONFIGS[name], mu=0.5)

    assert moved > 1e-3
    assert diff <= 1e-5 * max(1.0, moved) + 1e-6


def test_replay_refuses_private_optimiser_state_and_random_augmentation() -> None:
    kept = ClientConfig(optimizer="adam", optimizer_state="kept")
    flipped = ClientConfig(augment="hflip")

    assert "cannot know it" in str(replay_refusal(kept))
    assert "augment" in str(replay_refusal(flipped))
    # Plain SGD has no state: a kept (empty) state changes nothing.
    assert replay_refusal(ClientConfig(optimizer_state="kept")) is None
