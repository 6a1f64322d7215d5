"""Shared test set-up: quiet, single-threaded torch, Ray/Flower env flags."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import fedsim

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


@pytest.fixture
def plugin_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What loading a scenario's plugins changes in this process (``sys.path``, the
    variables that name them for child processes) is undone after the test."""
    import sys

    from fedsim.core import plugins
    from fedsim.scenario.validate import PLUGGABLE

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv(plugins.PLUGINS_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    plugins.refresh_entry_points()
    # What the test's plugins registered goes too: later tests see fedsim's own.
    registries = list(PLUGGABLE)
    for registry in registries:
        registry.names()  # fedsim's own modules register now, before the snapshot
    saved = [
        {k: dict(v) if isinstance(v, dict) else v for k, v in vars(r).items()} for r in registries
    ]
    modules = set(sys.modules)
    plugin_homes = (tempfile.gettempdir(), str(Path(fedsim.__file__).parents[1] / "examples"))
    yield
    # ... and the plugin modules, so that a later import registers them again.
    for name in set(sys.modules) - modules:
        where = str(getattr(sys.modules[name], "__file__", None) or "")
        if where.startswith(plugin_homes):
            del sys.modules[name]
    for registry, state in zip(registries, saved, strict=True):
        vars(registry).clear()
        vars(registry).update(state)
    plugins.refresh_entry_points()
