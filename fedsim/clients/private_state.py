"""Client-private parameters: what a client keeps and never sends.

Flower's ClientApps are ephemeral in a Ray simulation (an actor serves many
nodes in turn), so a routine cannot hold a model in memory between rounds.
What a client keeps private (FedSplit's and FedCG's extractor, FedCG's
discriminator, the ``local`` baseline's whole model) is stored twice:

- in Flower's per-node ``context.state`` (``env.state``) under
  :data:`STATE_KEY`, an ``ArrayRecord``: the simulation keeps it per node
  across rounds, in memory;
- in the run directory, ``env.state_dir / "partition-<id>.pt"``: a
  ``torch.save`` of ``{"round": int, "arrays": {name: tensor}}``, replaced
  atomically after every round the client trains, so a resumed run (a new
  simulation with empty node state) finds it. Read it with
  ``torch.load(path, weights_only=True)``.

The node state wins when both exist (it is this run's). Neither is ever in a
message: the server never reads ``state_dir``.

A client whose config keeps its optimiser state (``client.optimizer-state =
"kept"``) stores it the same two ways under :data:`OPTIMIZER_KEY`, in
``partition-<id>.optimizers.pt`` (:class:`KeptOptimizers`).
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import torch
from flwr.app import ArrayRecord, RecordDict

from fedsim.core.config import ClientConfig, first_line
from fedsim.core.training import load_optimizer_tensors, optimizer_tensors


class ClientEnv(Protocol):
    """What of a client's world (:class:`fedsim.clients.base.ClientEnv`) its private state uses."""

    partition_id: int
    state: RecordDict
    state_dir: Path | None


Tensors = Mapping[str, torch.Tensor]
STATE_KEY = "private-model"
OPTIMIZER_KEY = "private-optimizers"
_FILE_SUFFIX = {STATE_KEY: ".pt", OPTIMIZER_KEY: ".optimizers.pt"}


def state_file(state_dir: Path, partition_id: int, key: str = STATE_KEY) -> Path:
    """Where partition ``partition_id`` keeps its private tensors of kind ``key`` in a run."""
    return state_dir / f"partition-{partition_id}{_FILE_SUFFIX[key]}"


def load_private(env: ClientEnv, key: str = STATE_KEY) -> dict[str, torch.Tensor] | None:
    """This client's private tensors of kind ``key``, or ``None`` before it first saved any."""
    record = env.state.array_records.get(key)
    if record is not None:
        return dict(record.to_torch_state_dict())
    if env.state_dir is not None:
        path = state_file(env.state_dir, env.partition_id, key)
        if path.is_file() and not path.is_symlink():  # never read through a link
            return read_private(path)
    return None


def read_private(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a private-state file; ``ValueError`` saying why when it is not one.

    ``weights_only`` refuses pickled code (UnpicklingError) and truncation fails in the
    zip reader; a loadable file of another shape would fail later, in a client actor.
    """
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive
        raise ValueError("not a torch.save file")
    try:
        state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:  # torch's text here advises weights_only=False: not ours
        raise ValueError("it pickles Python objects other than tensors; not loaded") from None
    except Exception as err:  # whatever the zip reader meets first
        raise ValueError(first_line(err)) from None
    arrays = state.get("arrays") if isinstance(state, dict) else None
    if not (
        isinstance(arrays, dict)
        and isinstance(state.get("round"), int)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in arrays.items())
    ):
        raise ValueError("not {'round': int, 'arrays': {name: tensor}}")
    return dict(arrays)


def save_private(env: ClientEnv, tensors: Tensors, server_round: int, key: str = STATE_KEY) -> None:
    """Keep ``tensors`` in the node state and, when the run has one, in ``state_dir``."""
    cpu = {k: v.detach().cpu() for k, v in tensors.items()}
    env.state[key] = ArrayRecord(cpu)
    if env.state_dir is None:
        return
    env.state_dir.mkdir(parents=True, exist_ok=True)
    path = state_file(env.state_dir, env.partition_id, key)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)  # a link planted there is removed, never written through
    torch.save({"round": server_round, "arrays": cpu}, tmp)
    os.replace(tmp, path)  # a crash mid-write leaves the previous round's file


class KeptOptimizers:
    """A client's optimisers for one round, their state carried over when the config keeps it.

    ``make`` builds each (by name) and, under ``optimizer-state = "kept"``, gives it
    the state it ended its last round with; ``save`` stores them all after training.
    Under ``"fresh"`` both only build and forget.
    """

    def __init__(self, env: ClientEnv, cfg: ClientConfig) -> None:
        self.env = env
        self.kept = cfg.optimizer_state == "kept"
        self.saved = (load_private(env, OPTIMIZER_KEY) or {}) if self.kept else {}
        self.built: dict[str, torch.optim.Optimizer] = {}

    def make(self, name: str, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """``optimizer`` (fresh), with its kept state under ``name`` loaded when there is one."""
        if self.kept:
            load_optimizer_tensors(optimizer, self.saved, name)
        self.built[name] = optimizer
        return optimizer

    def save(self, server_round: int) -> None:
        """Keep every optimiser's state for the client's next round (when kept)."""
        if not self.kept:
            return
        tensors: dict[str, torch.Tensor] = {}
        for name, optimizer in self.built.items():
            tensors |= optimizer_tensors(optimizer, name)
        save_private(self.env, tensors, server_round, OPTIMIZER_KEY)
