"""Checkpoints: what a run directory holds after every round so a killed run can continue.

Layout under the run directory::

    checkpoint/
      state.pt          the last completed round: global model, strategy state,
                        server RNG states, component states (metrics rows, ...)
      manifest.json     SHA-256 of state.pt and of every file in client_state/
      client_state/     client_state/ as it was when that round ended
      stage-<r>/        transient: round r's checkpoint being written
      commit-<r>/       transient: round r's checkpoint being moved into place

A round commits in three steps: write ``stage-<r>`` (the new ``state.pt`` and
copies of the client files that changed since the last checkpoint), rename it
to ``commit-<r>`` (the atomic commit point), then move its files into place.
A run killed at any moment leaves either the previous round (a ``stage-`` is
discarded) or round ``r`` (a ``commit-`` is finished) when it is resumed.
Clients may already have written private files for a round that never
committed; resuming puts ``client_state/`` back as the checkpoint has it.

Resuming (:mod:`fedsim.simulation.resume`) verifies and loads what this writes.

What is not saved, because it is derived again: client sampling and injected
failures (seeded by seed and round), client training seeds (seed, round,
partition), the node -> partition map. Files load with
``torch.load(weights_only=True)``; the scenario is read back from
``scenario.toml`` with :mod:`tomllib`.

A per-run component with its own state or files (the recorder's rows, an
audit's rows) joins the checkpoint by implementing :class:`Checkpointable`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import stat
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedsim.core.config import ScenarioError
from fedsim.core.protocol import RoundRecord
from fedsim.outputs.run_folder import CHECKPOINT_DIR, CLIENT_STATE_DIR, inside
from fedsim.strategies.base import FedsimStrategy

STATE_FILE = "state.pt"
DELETED_FILE = "deleted.json"  # client files removed since the previous checkpoint
MANIFEST_FILE = "manifest.json"
FORMAT = 2  # 2: checksums in manifest.json
STATE_KEYS = ("format", "round", "arrays", "strategy", "rng", "components", "scenario")


@runtime_checkable
class Checkpointable(Protocol):
    """A per-run component whose state the checkpoint keeps.

    ``state_dict`` is called after every round, once all round callbacks ran;
    it returns what ``torch.load(weights_only=True)`` reads back (tensors,
    numbers, strings, and lists or dicts of them; NumPy values are converted).
    A component whose work runs asynchronously returns only what is finished
    for rounds up to this one, or joins it first. ``load_state_dict`` is called
    on resume before the first round and also puts the component's files
    (CSV rows, ...) back as they were at the checkpoint.
    """

    checkpoint_key: str

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Checkpoint:
    """A loaded checkpoint: everything needed to run the rounds after ``round``."""

    run_dir: Path
    round: int
    arrays: ArrayRecord
    strategy: dict[str, Any]
    rng: dict[str, Any]
    components: dict[str, dict[str, Any]]


def _plain(value: Any) -> Any:
    """``value`` with NumPy scalars and arrays and enums (the threat model) made loadable by
    ``weights_only``."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    return value


def capture_rng() -> dict[str, Any]:
    """The server process's global RNG states (torch, CUDA, NumPy, Python)."""
    _, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Undo :func:`capture_rng` (``weights_only`` loading turns tuples into lists)."""
    torch.set_rng_state(state["torch"])
    keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def regular_files(root: Path) -> dict[str, os.stat_result]:
    """Regular files under ``root`` (links are never followed nor copied)."""
    # A client that missed the reply deadline may still be writing (a temporary
    # file renamed away mid-scan); what vanishes is left to the next checkpoint.
    found: dict[str, os.stat_result] = {}
    for path in root.rglob("*") if root.is_dir() and not root.is_symlink() else ():
        with contextlib.suppress(FileNotFoundError):
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                found[path.relative_to(root).as_posix()] = st
    return found


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stamp(st: os.stat_result) -> tuple[int, int]:
    return st.st_size, st.st_mtime_ns


def _differences(source: Path, target: Path) -> tuple[list[str], list[str]]:
    """Files of ``source`` that ``target`` lacks or has otherwise, and files only in ``target``.

    Copies keep size and mtime (``shutil.copy2``), so equal stats mean equal files.
    """
    have, want = regular_files(target), regular_files(source)
    changed = [
        rel for rel, st in want.items() if rel not in have or _stamp(st) != _stamp(have[rel])
    ]
    return sorted(changed), sorted(set(have) - set(want))


def copy_files(source: Path, target: Path, files: Sequence[str]) -> None:
    for rel in files:
        destination = inside(target, rel)
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.unlink(missing_ok=True)  # a link there is removed, never written through
        with contextlib.suppress(FileNotFoundError):  # see regular_files
            shutil.copy2(inside(source, rel), destination, follow_symlinks=False)


def _json_list(path: Path) -> list[str]:
    names = json.loads(path.read_text())
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ScenarioError("run folder", str(path), "is not a list of file names")
    return names


def _apply(checkpoint_dir: Path, commit: Path) -> None:
    """Move a committed round's files into place; safe to repeat after a crash."""
    mirror = checkpoint_dir / CLIENT_STATE_DIR
    staged = commit / CLIENT_STATE_DIR
    for rel in regular_files(staged):
        destination = inside(mirror, rel)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged / rel, destination)
    deleted = commit / DELETED_FILE
    if deleted.is_file():
        for rel in _json_list(deleted):
            inside(mirror, rel).unlink(missing_ok=True)
    for name in (MANIFEST_FILE, STATE_FILE):
        if (commit / name).is_file():
            os.replace(commit / name, checkpoint_dir / name)
    shutil.rmtree(commit)


def read_manifest(checkpoint_dir: Path) -> dict[str, Any] | None:
    path = checkpoint_dir / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        manifest = None
    ok = (
        isinstance(manifest, dict)
        and isinstance(manifest.get("state"), str)
        and isinstance(manifest.get(CLIENT_STATE_DIR), dict)
    )
    if not ok:
        raise ScenarioError("--resume", str(path), "is damaged (not a fedsim checkpoint manifest)")
    return typing.cast(dict[str, Any], manifest)


def commit(run_dir: Path, server_round: int, state: dict[str, Any]) -> None:
    """Make ``state`` and the current ``client_state/`` the checkpoint of ``server_round``."""
    checkpoint_dir = run_dir / CHECKPOINT_DIR
    stage = checkpoint_dir / f"stage-{server_round}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    torch.save(_plain(state), stage / STATE_FILE)
    live = run_dir / CLIENT_STATE_DIR
    changed, deleted = _differences(live, checkpoint_dir / CLIENT_STATE_DIR)
    copy_files(live, stage / CLIENT_STATE_DIR, changed)
    (stage / DELETED_FILE).write_text(json.dumps(deleted))
    previous = read_manifest(checkpoint_dir) or {CLIENT_STATE_DIR: {}}
    digests = {k: v for k, v in previous[CLIENT_STATE_DIR].items() if k not in deleted}
    for rel, _st in regular_files(stage / CLIENT_STATE_DIR).items():
        digests[rel] = sha256(stage / CLIENT_STATE_DIR / rel)
    manifest = {"state": sha256(stage / STATE_FILE), CLIENT_STATE_DIR: digests}
    (stage / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    done = checkpoint_dir / f"commit-{server_round}"
    os.rename(stage, done)
    _apply(checkpoint_dir, done)


def recover(run_dir: Path) -> None:
    """Finish a commit that a kill interrupted and drop half-written stages."""
    checkpoint_dir = run_dir / CHECKPOINT_DIR
    if not checkpoint_dir.is_dir():
        return
    for path in sorted(checkpoint_dir.glob("commit-*")):
        _apply(checkpoint_dir, path)
    for path in checkpoint_dir.glob("stage-*"):
        shutil.rmtree(path)


class Checkpointer:
    """Round callback that commits a checkpoint; run it after every other callback."""

    def __init__(
        self,
        run_dir: Path,
        strategy: FedsimStrategy,
        scenario: Mapping[str, Any],
        components: Sequence[Checkpointable] = (),
    ) -> None:
        self.run_dir = run_dir
        self.strategy = strategy
        self.scenario = scenario  # as scenario.toml holds it (scenario_to_dict)
        self.components = components

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> None:
        strategy_state = self.strategy.state_for_checkpoint()
        state = {
            "format": FORMAT,
            "round": record.round,
            "arrays": arrays.to_torch_state_dict(),
            "strategy": strategy_state,
            "rng": capture_rng(),
            "components": {c.checkpoint_key: c.state_dict() for c in self.components},
            "scenario": self.scenario,
        }
        commit(self.run_dir, record.round, state)


def checkpointed_round(run_dir: Path) -> int | None:
    """The last round ``run_dir`` holds a checkpoint of, if any."""
    path = run_dir / CHECKPOINT_DIR / STATE_FILE
    return int(torch.load(path, weights_only=True)["round"]) if path.is_file() else None
