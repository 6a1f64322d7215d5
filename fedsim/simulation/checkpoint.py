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

Resuming trusts nothing in the folder: a checkpoint file that differs from its
checksum, a missing client file, a symbolic link anywhere, or a name that
leads outside the folder is refused with one line before anything is loaded
(:func:`fedsim.outputs.results.check_no_links`, :func:`~fedsim.outputs.results.inside`).

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
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedsim.clients.private_state import read_private
from fedsim.core.config import (
    Scenario,
    ScenarioError,
    first_line,
    load_scenario,
    path_kind,
    require,
    scenario_to_dict,
)
from fedsim.core.protocol import RoundRecord
from fedsim.outputs.run_folder import (
    CHECKPOINT_DIR,
    CLIENT_STATE_DIR,
    MODEL_FILE,
    SCENARIO_FILE,
    check_no_links,
    inside,
    lock_run_dir,
)
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
    """``value`` with NumPy scalars and arrays made loadable by ``weights_only``."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
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


def _files(root: Path) -> dict[str, os.stat_result]:
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
    have, want = _files(target), _files(source)
    changed = [
        rel for rel, st in want.items() if rel not in have or _stamp(st) != _stamp(have[rel])
    ]
    return sorted(changed), sorted(set(have) - set(want))


def _copy(source: Path, target: Path, files: Sequence[str]) -> None:
    for rel in files:
        destination = inside(target, rel)
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.unlink(missing_ok=True)  # a link there is removed, never written through
        with contextlib.suppress(FileNotFoundError):  # see _files
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
    for rel in _files(staged):
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


def _read_manifest(checkpoint_dir: Path) -> dict[str, Any] | None:
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
    _copy(live, stage / CLIENT_STATE_DIR, changed)
    (stage / DELETED_FILE).write_text(json.dumps(deleted))
    previous = _read_manifest(checkpoint_dir) or {CLIENT_STATE_DIR: {}}
    digests = {k: v for k, v in previous[CLIENT_STATE_DIR].items() if k not in deleted}
    for rel, _st in _files(stage / CLIENT_STATE_DIR).items():
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


def verify_checkpoint(run_dir: Path) -> dict[str, str]:
    """Check ``checkpoint/`` against its manifest; return the client files' digests.

    Raises :class:`ScenarioError` for a changed, damaged or missing file.
    """
    checkpoint_dir = run_dir / CHECKPOINT_DIR
    manifest = _read_manifest(checkpoint_dir)
    require(
        manifest is not None,
        "--resume",
        str(run_dir),
        f"{CHECKPOINT_DIR}/{MANIFEST_FILE} is missing: the checkpoint cannot be verified "
        "(written by an older fedsim, or damaged); start the run again",
    )
    assert manifest is not None
    if sha256(checkpoint_dir / STATE_FILE) != manifest["state"]:
        raise ScenarioError(
            "--resume",
            str(run_dir),
            f"{CHECKPOINT_DIR}/{STATE_FILE} does not match its checksum: it was changed or "
            "damaged after it was written",
        )
    digests: dict[str, str] = manifest[CLIENT_STATE_DIR]
    mirror = checkpoint_dir / CLIENT_STATE_DIR
    found = _files(mirror)
    for rel, digest in sorted(digests.items()):
        path = inside(mirror, rel)
        where = f"{CHECKPOINT_DIR}/{CLIENT_STATE_DIR}/{rel}"
        require(rel in found, "--resume", str(run_dir), f"{where} is missing")
        if sha256(path) != digest:
            raise ScenarioError(
                "--resume", str(run_dir), f"{where} does not match its checksum (damaged)"
            )
    extra = sorted(set(found) - set(digests))
    require(
        not extra,
        "--resume",
        str(run_dir),
        f"{CHECKPOINT_DIR}/{CLIENT_STATE_DIR}/{extra[0] if extra else ''} is not in the "
        "checkpoint's manifest",
    )
    return digests


def check_client_files(run_dir: Path, digests: Mapping[str, str]) -> None:
    """Every private-state file (``*.pt``) of the checkpoint loads as one, weights only.

    Checksums prove a file unchanged since it was written, not that a fedsim client
    wrote it: a forger can update the manifest too. A client would fail on it in its
    actor; refused here instead, naming the file.
    """
    mirror = run_dir / CHECKPOINT_DIR / CLIENT_STATE_DIR
    for rel in sorted(r for r in digests if r.endswith(".pt")):
        try:
            read_private(inside(mirror, rel))
        except ValueError as err:
            raise ScenarioError(
                "--resume",
                str(run_dir),
                f"{CHECKPOINT_DIR}/{CLIENT_STATE_DIR}/{rel} is not a weights-only state dict "
                f"of a fedsim client ({err}); start the run again",
            ) from None


def restore_client_state(run_dir: Path) -> None:
    """Put ``client_state/`` back as the checkpoint has it (clients may have written past it).

    Files are compared by checksum with the checkpoint's manifest: a damaged,
    missing or extra live file is replaced or removed.
    """
    live = run_dir / CLIENT_STATE_DIR
    mirror = run_dir / CHECKPOINT_DIR / CLIENT_STATE_DIR
    digests = verify_checkpoint(run_dir)
    have = _files(live)
    for rel in sorted(set(have) - set(digests)):
        inside(live, rel).unlink()
    stale = [rel for rel, d in digests.items() if rel not in have or sha256(live / rel) != d]
    _copy(mirror, live, stale)


class Checkpointer:
    """Round callback that commits a checkpoint; run it after every other callback."""

    def __init__(
        self,
        run_dir: Path,
        strategy: FedsimStrategy,
        scenario: Scenario,
        components: Sequence[Checkpointable] = (),
    ) -> None:
        self.run_dir = run_dir
        self.strategy = strategy
        self.scenario = scenario_to_dict(scenario)
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


def _flat(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def checkpointed_round(run_dir: Path) -> int | None:
    """The last round ``run_dir`` holds a checkpoint of, if any."""
    path = run_dir / CHECKPOINT_DIR / STATE_FILE
    return int(torch.load(path, weights_only=True)["round"]) if path.is_file() else None


def open_resume(run_dir: str | Path) -> tuple[Scenario, Checkpoint]:
    """The scenario and last checkpoint of ``run_dir``, ready to continue.

    Finishes an interrupted commit and puts ``client_state/`` back as the
    checkpoint has it. Raises :class:`ScenarioError` when the folder cannot
    resume. ``federation.rounds`` in the run's ``scenario.toml`` may be raised
    to extend a run; any other change since the checkpoint is refused.
    """
    path = Path(run_dir)
    require(
        path.is_dir(),
        "--resume",
        str(path),
        f"is {path_kind(path)}; expected a run directory (the folder fedsim run wrote)",
    )
    require(
        (path / SCENARIO_FILE).is_file(),
        "--resume",
        str(path),
        f"is not a fedsim run directory (no {SCENARIO_FILE})",
    )
    check_no_links(path)
    lock_run_dir(path)
    scenario = load_scenario(path / SCENARIO_FILE)
    recover(path)
    state_path = path / CHECKPOINT_DIR / STATE_FILE
    require(
        state_path.is_file() or not os.path.lexists(state_path),
        "--resume",
        str(path),
        f"{CHECKPOINT_DIR}/{STATE_FILE} is {path_kind(state_path)}; expected the checkpoint "
        "file torch.save wrote",
    )
    require(
        state_path.is_file(),
        "--resume",
        str(path),
        "has no checkpoint: the run stopped before its first round ended; start it again",
    )
    check_client_files(path, verify_checkpoint(path))
    try:
        state = torch.load(state_path, weights_only=True)
    except Exception as err:  # any unreadable file is one refusal
        # weights_only refuses arbitrary objects (UnpicklingError); truncation
        # and garbage raise whatever the zip or pickle reader meets first.
        reason = first_line(err)
        raise ScenarioError(
            "--resume",
            str(path),
            f"{CHECKPOINT_DIR}/{STATE_FILE} is not a fedsim checkpoint: {reason}",
        ) from None
    require(
        isinstance(state, dict) and state.get("format") == FORMAT,
        "--resume",
        str(path),
        f"checkpoint format unknown (this fedsim writes format {FORMAT})",
    )
    missing = [key for key in STATE_KEYS if key not in state]
    require(
        not missing,
        "--resume",
        str(path),
        f"{CHECKPOINT_DIR}/{STATE_FILE} lacks {', '.join(missing)}: not a complete checkpoint",
    )
    # The file as written, not as parsed: keys a newer fedsim added, with their
    # defaults, are no edit.
    written = tomllib.loads((path / SCENARIO_FILE).read_text())
    saved, now = _flat(state["scenario"]), _flat(written)
    changed = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
    changed = [k for k in changed if k != "federation.rounds"]
    if changed:
        raise ScenarioError(
            "--resume",
            str(path),
            f"{SCENARIO_FILE} changed since the checkpoint ({changed[0]}); "
            "only federation.rounds may change",
        )
    rounds = scenario.federation.rounds
    # Fewer rounds than were run would leave metrics and summary disagreeing with
    # scenario.toml.
    require(
        rounds >= state["round"],
        "federation.rounds",
        rounds,
        f"is below the {state['round']} rounds {path} already ran; rounds may only be raised",
    )
    # Killed after the last round's checkpoint but before the final model was
    # saved: resuming runs no round and writes what is missing.
    require(
        state["round"] < rounds or not (path / MODEL_FILE).is_file(),
        "--resume",
        str(path),
        f"the run already finished all {rounds} rounds (raise federation.rounds to extend it)",
    )
    restore_client_state(path)
    checkpoint = Checkpoint(
        run_dir=path,
        round=state["round"],
        arrays=ArrayRecord(state["arrays"]),
        strategy=state["strategy"],
        rng=state["rng"],
        components=state["components"],
    )
    return scenario, checkpoint
