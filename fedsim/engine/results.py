"""The run directory: resolved scenario, per-round metrics, final model, summary.

Rows are written as each round ends (the CSV is rewritten atomically), so an
interrupted run keeps every finished round; ``checkpoint/`` holds what a
resumed run needs (:mod:`fedsim.engine.checkpoint`).
"""

from __future__ import annotations

import fcntl
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import pandas as pd
import tomli_w
import torch
from flwr.app import ArrayRecord
from rich.console import Console

from fedsim.core import protocol
from fedsim.core.config import Scenario, ScenarioError, require, scenario_to_dict
from fedsim.engine.loop import RoundRecord

METRICS_FILE = "metrics.csv"
CLIENTS_FILE = "clients.csv"
SCENARIO_FILE = "scenario.toml"
MODEL_FILE = "model.pt"
SUMMARY_FILE = "summary.md"
AUDIT_FILE = "audit.csv"  # one row per attack (fedsim.core.protocol.AuditRecord)
AUDIT_IMAGES = "audit"  # truth above reconstruction, one PNG per attack
CLIENT_STATE_DIR = "client_state"  # client-private files; never read by the server
CHECKPOINT_DIR = "checkpoint"
LOCK_FILE = ".lock"  # held (flock) by the one process running in the folder

_held_locks: dict[Path, int] = {}  # run folder -> descriptor holding its lock, per process


def write_csv_atomic(rows: list[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` to ``path`` via a temporary file and a rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    pd.DataFrame(rows).to_csv(tmp, index=False)
    os.replace(tmp, path)


def _refuse(run_dir: Path, what: str) -> ScenarioError:
    return ScenarioError("run folder", str(run_dir), what)


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
        raise _refuse(
            run_dir, "is in use by another fedsim process; wait for it or choose another folder"
        ) from None
    _held_locks[key] = fd


def unlock_run_dir(run_dir: Path) -> None:
    """Let another process run in ``run_dir`` (this one's run there is over)."""
    fd = _held_locks.pop(run_dir.resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the flock


def new_run_dir(scenario: Scenario, out: str | Path | None) -> Path:
    """``out`` if given, else ``<output.dir>/<name>-<timestamp>``; created empty and locked."""
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(scenario.output.dir) / f"{scenario.name}-{stamp}"
        suffix = 1
        while path.exists():
            path = Path(scenario.output.dir) / f"{scenario.name}-{stamp}-{suffix}"
            suffix += 1
    else:
        path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ScenarioError(
            "output.dir", str(path), f"cannot be created ({err.strerror})"
        ) from None
    lock_run_dir(path)
    if (path / SCENARIO_FILE).is_file():
        # A fresh run in an old run's folder: stale client-private state or a
        # stale checkpoint would leak into it or into a later --resume.
        for stale in (path / CHECKPOINT_DIR, path / CLIENT_STATE_DIR):
            if stale.is_symlink():  # the link goes, never what it points at
                stale.unlink()
            shutil.rmtree(stale, ignore_errors=True)
    return path


def write_scenario(scenario: Scenario, run_dir: Path) -> None:
    (run_dir / SCENARIO_FILE).write_text(tomli_w.dumps(scenario_to_dict(scenario)))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


@dataclass
class RunRecorder:
    """Round callback writing ``metrics.csv`` / ``clients.csv`` and printing progress.

    ``clients.csv`` has a row per client and phase; a client that failed has
    its ``failure`` (``error`` or ``timeout``) and no metrics.
    """

    run_dir: Path
    total_rounds: int
    console: Console = field(default_factory=lambda: Console(soft_wrap=True))
    rows: list[dict[str, Any]] = field(default_factory=list)
    client_rows: list[dict[str, Any]] = field(default_factory=list)
    checkpoint_key: ClassVar[str] = "recorder"

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> None:
        row: dict[str, Any] = {
            protocol.ROUND: record.round,
            protocol.TRAIN_LOSS: record.train.get(protocol.TRAIN_LOSS, math.nan),
            protocol.TEST_ACC: record.server.get(protocol.TEST_ACC, math.nan),
            protocol.TEST_LOSS: record.server.get(protocol.TEST_LOSS, math.nan),
            protocol.CLIENT_EVAL_ACC: record.evaluate.get(protocol.EVAL_ACC, math.nan),
            protocol.CLIENT_EVAL_LOSS: record.evaluate.get(protocol.EVAL_LOSS, math.nan),
            protocol.CLIENTS_SAMPLED: record.sampled,
            protocol.CLIENTS_TRAINED: record.replies,
            protocol.FAILURES: record.failures,
            protocol.SECONDS: record.seconds,
        }
        # Strategy-specific metrics get their own columns (client ones prefixed).
        extra = {**record.train, **{f"client-{k}": v for k, v in record.evaluate.items()}}
        for key, value in {**extra, **record.server}.items():
            row.setdefault(key, value)
        self.rows.append(row)
        self.client_rows.extend(record.clients)
        self._write()
        shown = (protocol.TRAIN_LOSS, protocol.TEST_ACC, protocol.CLIENT_EVAL_ACC)
        parts = "  ".join(f"{k} {_fmt(row[k])}" for k in shown)
        failed = ", ".join(f"#{client} {kind}" for client, kind in record.failed.items())
        self.console.print(
            f"[bold]round {record.round}/{self.total_rounds}[/bold]  {parts}  "
            f"clients {record.replies}/{record.sampled}  {record.seconds:.1f}s"
            + (f"  failed: {failed}" if failed else "")
        )

    def _write(self) -> None:
        write_csv_atomic(self.rows, self.run_dir / METRICS_FILE)
        write_csv_atomic(self.client_rows, self.run_dir / CLIENTS_FILE)

    def state_dict(self) -> dict[str, Any]:
        """The rows so far (the checkpoint keeps them, see :mod:`fedsim.engine.checkpoint`)."""
        return {"rows": self.rows, "client_rows": self.client_rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from checkpointed rows; the CSVs drop rows of unfinished rounds."""
        self.rows, self.client_rows = list(state["rows"]), list(state["client_rows"])
        self._write()


def save_model(arrays: ArrayRecord, run_dir: Path) -> None:
    torch.save(arrays.to_torch_state_dict(), run_dir / MODEL_FILE)


def accuracy_line(last: dict[str, Any], best: float) -> str:
    """Final accuracies; strategies without a global model report only their clients'."""
    client = f"final client-eval accuracy: {_fmt(last.get('client-eval-acc', math.nan))}"
    test = last.get(protocol.TEST_ACC, math.nan)
    if math.isnan(test):
        return f"- no global model to test (personalised evaluation); {client}"
    return f"- final test accuracy: {_fmt(test)} (best {_fmt(best)}); {client}"


def write_summary(scenario: Scenario, rows: list[dict[str, Any]], run_dir: Path) -> str:
    """A short markdown summary of the run (also returned for printing)."""
    last = rows[-1] if rows else {}
    best = max((r.get(protocol.TEST_ACC, math.nan) for r in rows), default=math.nan)
    total = sum(r.get(protocol.SECONDS, 0.0) for r in rows)
    lines = [
        f"# {scenario.name}",
        "",
        scenario.description or "",
        "",
        f"- strategy: {scenario.strategy.name}; model: {scenario.model.name} "
        f"({scenario.model.init}); dataset: {scenario.data.dataset} "
        f"({scenario.data.partitioner.name})",
        f"- clients: {scenario.federation.num_clients}, "
        f"{scenario.federation.sampled_per_round} per round; rounds: {len(rows)}",
        accuracy_line(last, best),
        f"- wall time in rounds: {total:.1f}s",
    ]
    failures = [r for r in rows if r.get(protocol.FAILURES, 0)]
    if failures:
        count = sum(int(r[protocol.FAILURES]) for r in failures)
        lines.append(f"- client failures: {count} in {len(failures)} of {len(rows)} rounds")
    text = "\n".join(lines) + "\n"
    (run_dir / SUMMARY_FILE).write_text(text)
    return text
