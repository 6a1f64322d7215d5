"""Shared test set-up: quiet, single-threaded torch, Ray/Flower env flags."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
torch.set_num_threads(1)


@pytest.fixture
def quick_scenario_table() -> dict[str, object]:
    """A tiny valid scenario (raw tables) for tests to modify."""
    return {
        "name": "test",
        "federation": {"num-clients": 3, "clients-per-round": 3, "rounds": 2, "seed": 0},
        "data": {"dataset": "mnist-embedded", "samples-per-client": 500, "normalize": True},
        "model": {"name": "lenet5-split"},
        "strategy": {"name": "fedavg"},
        "client": {"local-epochs": 2, "batch-size": 16, "optimizer": "adam", "lr": 0.003},
    }


@pytest.fixture
def message_identity() -> Iterator[None]:
    """Lets a test build Flower ``Message`` objects outside a running simulation."""
    from fedsim.simulation.flower import message_context

    with message_context():
        yield
