"""Resuming a run: its folder checked, its last checkpoint verified, loaded and put back.

Resuming trusts nothing in the folder: a checkpoint file that differs from its
checksum, a missing client file, a symbolic link anywhere, or a name that
leads outside the folder is refused with one line before anything is loaded
(:func:`fedsim.outputs.results.check_no_links`, :func:`~fedsim.outputs.results.inside`).
``federation.rounds`` in the run's ``scenario.toml`` may be raised to extend a
run; any other change since the checkpoint is refused. The layout and the
commit protocol are :mod:`fedsim.simulation.checkpoint`'s.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord

from fedsim.clients.private_state import read_private
from fedsim.core.config import Scenario, ScenarioError, first_line, require
from fedsim.core.scenario_file import load_scenario, path_kind
from fedsim.outputs.run_folder import (
    CHECKPOINT_DIR,
    CLIENT_STATE_DIR,
    MODEL_FILE,
    SCENARIO_FILE,
    check_no_links,
    inside,
    lock_run_dir,
)
from fedsim.simulation.checkpoint import (
    FORMAT,
    MANIFEST_FILE,
    STATE_FILE,
    STATE_KEYS,
    Checkpoint,
    copy_files,
    read_manifest,
    recover,
    regular_files,
    sha256,
)


def verify_checkpoint(run_dir: Path) -> dict[str, str]:
    """Check ``checkpoint/`` against its manifest; return the client files' digests.

    Raises :class:`ScenarioError` for a changed, damaged or missing file.
    """
    checkpoint_dir = run_dir / CHECKPOINT_DIR
    manifest = read_manifest(checkpoint_dir)
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
    found = regular_files(mirror)
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
    have = regular_files(live)
    for rel in sorted(set(have) - set(digests)):
        inside(live, rel).unlink()
    stale = [rel for rel, d in digests.items() if rel not in have or sha256(live / rel) != d]
    copy_files(mirror, live, stale)


def _flat(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _check_run_dir(path: Path) -> None:
    """``path`` is a run directory fedsim wrote, with no link anywhere inside."""
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


def _load_state(path: Path) -> dict[str, Any]:
    """The verified checkpoint's ``state.pt``, loaded weights only and complete."""
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
    return state


def _check_continues(path: Path, state: Mapping[str, Any], rounds: int) -> None:
    """``scenario.toml`` is the checkpoint's but for more rounds, and rounds are left to run."""
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


def open_resume(run_dir: str | Path) -> tuple[Scenario, Checkpoint]:
    """The scenario and last checkpoint of ``run_dir``, ready to continue.

    Finishes an interrupted commit and puts ``client_state/`` back as the
    checkpoint has it. Raises :class:`ScenarioError` when the folder cannot
    resume. ``federation.rounds`` in the run's ``scenario.toml`` may be raised
    to extend a run; any other change since the checkpoint is refused.
    """
    path = Path(run_dir)
    _check_run_dir(path)
    lock_run_dir(path)
    scenario = load_scenario(path / SCENARIO_FILE)
    recover(path)
    state = _load_state(path)
    _check_continues(path, state, scenario.federation.rounds)
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
