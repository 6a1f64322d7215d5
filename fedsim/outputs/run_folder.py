"""The run folder: what a run writes where, created, locked and cleared safely.

Every file a run writes is named here; a folder is held by one process at a
time (an advisory lock), refuses symbolic links, and ``--force`` clears only
the run's own outputs.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import time
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd
import tomli_w
import torch
from flwr.app import ArrayRecord

from fedsim.core.config import OutputConfig, Scenario, ScenarioError, require
from fedsim.core.scenario_file import scenario_to_dict

METRICS_FILE = "metrics.csv"


CLIENTS_FILE = "clients.csv"


SCENARIO_FILE = "scenario.toml"


MODEL_FILE = "model.pt"


SUMMARY_FILE = "summary.md"


AUDIT_FILE = "audit.csv"  # one row per attack (fedsim.core.protocol.AuditRecord)


AUDIT_IMAGES = "audit"  # truth above reconstruction, one PNG per attack


VERDICT_FILE = "verdict.csv"  # one row per victim and round (fedsim.core.protocol.VerdictRecord)


LEAKS_FILE = "leaks.csv"  # one row per leak analysis on a client (fedsim.core.protocol.LeakRecord)


# Every membership candidate's score and membership, for the report's ROC curves.
MEMBERSHIP_FILE = "membership.csv"


CLIENT_STATE_DIR = "client_state"  # client-private files; never read by the server


CHECKPOINT_DIR = "checkpoint"


REPORT_FILE = "report.html"


TRACEBACK_FILE = "traceback.txt"  # why a run that failed after its start stopped, in full


RUN_INFO_FILE = "run.json"  # what a finished run measured about itself (wall seconds)


WALL_SECONDS = "wall-seconds"
DEPARTURES = "departures"  # where the run's strategy settings depart from its authors'


TENSORBOARD_DIR = "tensorboard"


RAY_SESSION_FILE = "ray-session.json"  # the run's Ray processes, reaped by the next run


# Everything a run writes into its folder: what ``--force`` clears.
RUN_OUTPUTS = (
    SCENARIO_FILE,
    METRICS_FILE,
    CLIENTS_FILE,
    MODEL_FILE,
    SUMMARY_FILE,
    RUN_INFO_FILE,
    AUDIT_FILE,
    AUDIT_IMAGES,
    VERDICT_FILE,
    LEAKS_FILE,
    MEMBERSHIP_FILE,
    CLIENT_STATE_DIR,
    CHECKPOINT_DIR,
    REPORT_FILE,
    TENSORBOARD_DIR,
    RAY_SESSION_FILE,
)


LOCK_FILE = ".lock"  # held (flock) by the one process running in the folder


_held_locks: dict[Path, int] = {}  # run folder -> descriptor holding its lock, per process


def write_csv_atomic(rows: list[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` to ``path`` via a temporary file and a rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    pd.DataFrame(rows).to_csv(tmp, index=False)
    os.replace(tmp, path)


def _refuse(run_dir: Path, what: str) -> ScenarioError:
    return ScenarioError("run folder", str(run_dir), what)


def _in_use(run_dir: Path) -> ScenarioError:
    return _refuse(
        run_dir, "is in use by another fedsim process; wait for it or choose another folder"
    )


def check_no_links(run_dir: Path) -> None:
    """A run folder is plain files: fedsim never reads or writes through a symbolic link in it."""
    for folder, dirs, files in os.walk(run_dir):  # does not descend into linked folders
        for name in (*dirs, *files):
            path = Path(folder) / name
            if path.is_symlink():
                raise _refuse(
                    run_dir,
                    f"holds a symbolic link ({path.relative_to(run_dir)}); "
                    "a run folder may hold only plain files and folders",
                )


def inside(root: Path, rel: str) -> Path:
    """``root / rel`` for a name read from a run folder's own files, kept inside ``root``.

    ``rel`` must be relative, without ``..``, and no part of the path below
    ``root`` may be a symbolic link.
    """
    pure = PurePosixPath(rel)
    plain = (
        bool(rel)
        and not pure.is_absolute()
        and all(part not in ("", ".", "..") for part in pure.parts)
        and "\\" not in rel
        and "\0" not in rel
    )
    require(plain, "run folder", str(root), f"names a path outside itself: {rel!r}")
    path = root.joinpath(*pure.parts)
    below = path
    while below != root:
        if below.is_symlink():
            raise _refuse(root, f"reaches outside itself through a link ({rel!r})")
        below = below.parent
    return path


def lock_run_dir(run_dir: Path) -> None:
    """Refuse a second process running in ``run_dir``; this process keeps the lock until it exits.

    ``flock`` locks die with their process, so a killed run leaves no stale lock.
    """
    key = run_dir.resolve()
    if key in _held_locks:
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(run_dir / LOCK_FILE, flags, 0o644)
    except OSError as err:
        raise _refuse(run_dir, f"cannot hold its lock file {LOCK_FILE} ({err.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _in_use(run_dir) from None
    _held_locks[key] = fd


def unlock_run_dir(run_dir: Path) -> None:
    """Let another process run in ``run_dir`` (this one's run there is over)."""
    fd = _held_locks.pop(run_dir.resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the flock


def new_run_dir(
    output: OutputConfig, name: str, out: str | Path | None, force: bool = False
) -> Path:
    """``out`` if given, else ``<output.dir>/<name>-<timestamp>``; created empty and locked.

    A given ``out`` that already holds files is refused (a
    :class:`ScenarioError`) unless ``force``, which removes every file a run
    writes (:data:`RUN_OUTPUTS`) so nothing of the old run survives into the new.
    """
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(output.dir) / f"{name}-{stamp}"
        suffix = 1
        while path.exists():
            path = Path(output.dir) / f"{name}-{stamp}-{suffix}"
            suffix += 1
    else:
        path = Path(out)
        check_out_folder(path, force)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ScenarioError(
            "output.dir", str(path), f"cannot be created ({err.strerror})"
        ) from None
    lock_run_dir(path)  # before looking inside: another run may be writing there
    if any(entry.name != LOCK_FILE for entry in path.iterdir()):
        if not force:
            unlock_run_dir(path)
            raise _occupied(path)
        clear_run_outputs(path)
    return path


def _occupied(path: Path) -> ScenarioError:
    return ScenarioError(
        "--out",
        str(path),
        "a new or empty folder; this one holds files (continue a stopped run "
        "with --resume, or pass --force to replace the run files in it)",
    )


def check_out_folder(out: str | Path | None, force: bool = False) -> None:
    """Refuse an ``--out`` that :func:`new_run_dir` would refuse, creating and locking nothing.

    Called before Ray starts, so a finished or running run's folder is refused at
    once rather than after the start-up; :func:`new_run_dir` checks again under the lock.
    """
    if out is None:
        return
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ScenarioError("--out", str(path), "a folder; this is a file")
    if not path.is_dir() or path.resolve() in _held_locks:
        return
    lock = path / LOCK_FILE
    if lock.is_file() and not lock.is_symlink():
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(path) from None
        finally:
            os.close(fd)  # releases the probe's lock, if it got one
    if not force and any(entry.name != LOCK_FILE for entry in path.iterdir()):
        raise _occupied(path)


def clear_run_outputs(path: Path) -> None:
    """Remove everything a run writes from ``path`` (other files stay)."""
    for name in RUN_OUTPUTS:
        target = path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


def audit_image_name(server_round: int, client: int, attack: str) -> str:
    """The labelled reconstruction grid of one attack, in :data:`AUDIT_IMAGES` (with
    ``-only`` after the attack's name: its matched reconstructions alone)."""
    return f"round-{server_round:03d}-client-{client}-{attack}.png"


def representative_image_name(server_round: int, client: int, analysis: str, cls: int) -> str:
    """One class's representative under the client's class-mean image, in
    :data:`AUDIT_IMAGES` (a cell of the report's representatives table)."""
    return audit_image_name(server_round, client, f"{analysis}-class-{cls}")


def truth_image_name(server_round: int, client: int) -> str:
    """A victim's true batch, in :data:`AUDIT_IMAGES` (the report's reconstruction table)."""
    return f"round-{server_round:03d}-client-{client}.truth.png"


def write_scenario(scenario: Scenario, run_dir: Path) -> None:
    (run_dir / SCENARIO_FILE).write_text(tomli_w.dumps(scenario_to_dict(scenario)))


def save_model(arrays: ArrayRecord, run_dir: Path) -> None:
    # Whole or absent: a run stopped mid-write must still resume (model.pt marks it finished).
    tmp = run_dir / f"{MODEL_FILE}.tmp"
    torch.save(arrays.to_torch_state_dict(), tmp)
    os.replace(tmp, run_dir / MODEL_FILE)


def read_wall_seconds(run_dir: Path) -> float:
    """A finished run's true wall time (nan for a run without :data:`RUN_INFO_FILE`)."""
    path = run_dir / RUN_INFO_FILE
    if not path.is_file():
        return math.nan
    return float(json.loads(path.read_text()).get(WALL_SECONDS, math.nan))


def read_departures(run_dir: Path) -> list[str]:
    """Where a finished run departed from its strategy's published settings (the
    summary's lines; empty for a run without any or without :data:`RUN_INFO_FILE`)."""
    path = run_dir / RUN_INFO_FILE
    if not path.is_file():
        return []
    return [str(line) for line in json.loads(path.read_text()).get(DEPARTURES, [])]


def read_audit(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run's ``audit.csv`` and ``leaks.csv`` (empty frames where absent)."""
    frames = []
    for name in (AUDIT_FILE, LEAKS_FILE):
        path = run_dir / name
        frames.append(pd.read_csv(path) if path.is_file() else pd.DataFrame())
    return frames[0], frames[1]
