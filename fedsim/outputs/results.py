"""The run directory: resolved scenario, per-round metrics, final model, summary.

Rows are written as each round ends (the CSV is rewritten atomically), so an
interrupted run keeps every finished round; ``checkpoint/`` holds what a
resumed run needs (:mod:`fedsim.simulation.checkpoint`).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import tomli_w
import torch
from flwr.app import ArrayRecord
from rich.console import Console
from tabulate import tabulate

from fedsim.core import protocol
from fedsim.core.config import AuditConfig, Scenario, ScenarioError, require, scenario_to_dict
from fedsim.core.protocol import AuditRecord, RoundRecord
from fedsim.outputs.verdict import round_verdicts, victim_verdicts

METRICS_FILE = "metrics.csv"
CLIENTS_FILE = "clients.csv"
SCENARIO_FILE = "scenario.toml"
MODEL_FILE = "model.pt"
SUMMARY_FILE = "summary.md"
AUDIT_FILE = "audit.csv"  # one row per attack (fedsim.core.protocol.AuditRecord)
AUDIT_IMAGES = "audit"  # truth above reconstruction, one PNG per attack
VERDICT_FILE = "verdict.csv"  # one row per victim and round (fedsim.core.protocol.VerdictRecord)
CLIENT_STATE_DIR = "client_state"  # client-private files; never read by the server
CHECKPOINT_DIR = "checkpoint"
REPORT_FILE = "report.html"
RUN_INFO_FILE = "run.json"  # what a finished run measured about itself (wall seconds)
WALL_SECONDS = "wall-seconds"
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
    CLIENT_STATE_DIR,
    CHECKPOINT_DIR,
    REPORT_FILE,
    TENSORBOARD_DIR,
    RAY_SESSION_FILE,
)
# An attack "succeeds" when its reconstruction reaches this PSNR (dB, peak 1): at
# 20 dB (RMSE 0.1 on [0, 1] pixels) digits and faces are plainly recognisable.
DEFAULT_SUCCESS_PSNR = 20.0
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


def new_run_dir(scenario: Scenario, out: str | Path | None, force: bool = False) -> Path:
    """``out`` if given, else ``<output.dir>/<name>-<timestamp>``; created empty and locked.

    A given ``out`` that already holds files is refused (a
    :class:`ScenarioError`) unless ``force``, which removes every file a run
    writes (:data:`RUN_OUTPUTS`) so nothing of the old run survives into the new.
    """
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(scenario.output.dir) / f"{scenario.name}-{stamp}"
        suffix = 1
        while path.exists():
            path = Path(scenario.output.dir) / f"{scenario.name}-{stamp}-{suffix}"
            suffix += 1
    else:
        path = Path(out)
        if path.exists() and not path.is_dir():
            raise ScenarioError("--out", str(path), "a folder; this is a file")
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
            raise ScenarioError(
                "--out",
                str(path),
                "a new or empty folder; this one holds files (continue a stopped run "
                "with --resume, or pass --force to replace the run files in it)",
            )
        clear_run_outputs(path)
    return path


def clear_run_outputs(path: Path) -> None:
    """Remove everything a run writes from ``path`` (other files stay)."""
    for name in RUN_OUTPUTS:
        target = path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


def audit_image_name(server_round: int, client: int, attack: str) -> str:
    """The labelled reconstruction grid of one attack, in :data:`AUDIT_IMAGES`."""
    return f"round-{server_round:03d}-client-{client}-{attack}.png"


def write_scenario(scenario: Scenario, run_dir: Path) -> None:
    (run_dir / SCENARIO_FILE).write_text(tomli_w.dumps(scenario_to_dict(scenario)))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def duration(seconds: float) -> str:
    """``seconds`` for people: ``42.0s``, ``3m05s``, ``1h02m``."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def mean_std_text(mean: float, std: float, scale: float = 1.0, digits: int = 2) -> str:
    """``mean ± std`` for a table (``-`` without a mean, no ``±`` without a spread)."""
    if not math.isfinite(mean):
        return "-"
    text = f"{mean * scale:.{digits}f}"
    return text if not math.isfinite(std) else f"{text} ± {std * scale:.{digits}f}"


def number_text(value: float, digits: int = 2, scale: float = 1.0, unit: str = "") -> str:
    """``value`` for a table (``-`` for nan)."""
    return f"{value * scale:.{digits}f}{unit}" if not math.isnan(value) else "-"


def leakage_stats(psnr: Any, threshold: float = DEFAULT_SUCCESS_PSNR) -> dict[str, float]:
    """Mean, median and max PSNR of attacks, and the share reaching ``threshold`` dB.

    A mean alone hides a split (3.3 and 54.7 dB average to 29 dB). Mean and
    median leave non-finite PSNRs out (an exact reconstruction has PSNR inf);
    the max and the success share count them.
    """
    values = np.asarray(psnr, dtype=float)
    finite = values[np.isfinite(values)]
    known = values[~np.isnan(values)]
    return {
        "psnr-mean": float(finite.mean()) if len(finite) else math.nan,
        "psnr-median": float(np.median(finite)) if len(finite) else math.nan,
        "psnr-max": float(known.max()) if len(known) else math.nan,
        "success-rate": float((known >= threshold).sum() / len(values))
        if len(values)
        else math.nan,
    }


def audit_table(audit: pd.DataFrame, threshold: float = DEFAULT_SUCCESS_PSNR) -> pd.DataFrame:
    """Per attack: attacks run, leakage stats, mean SSIM and label accuracy."""
    col = AuditRecord.column
    rows = [
        {
            "attack": attack,
            "attacks": len(group),
            **leakage_stats(group[col("psnr")], threshold),
            "ssim-mean": float(group[col("ssim")].mean()),
            "label-acc-mean": float(group[col("label_acc")].mean()),
            "converged-share": (
                float(group[col("converged")].astype(bool).mean())
                if col("converged") in group  # absent from runs recorded before it was
                else math.nan
            ),
            "seconds-mean": float(group[col("seconds")].mean()),
        }
        for attack, group in audit.groupby(col("attack"), sort=False)
    ]
    return pd.DataFrame(rows)


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
    # Wall time of this session, plus that of earlier sessions of a resumed run.
    started: float = field(default_factory=time.monotonic)
    earlier_seconds: float = 0.0
    _first_round_ended: float | None = field(default=None, init=False, repr=False)
    _session_intervals: int = field(default=0, init=False, repr=False)
    checkpoint_key: ClassVar[str] = "recorder"

    @property
    def wall_seconds(self) -> float:
        """Seconds the run has taken so far (start-up, rounds, audit), over all sessions."""
        return self.earlier_seconds + time.monotonic() - self.started

    def _eta_seconds(self, record: RoundRecord) -> float:
        """Time left after ``record``'s round: the mean wall time between this
        session's round ends (a round's own seconds leave out the sync audit), so
        known from the session's second round on."""
        now = time.monotonic()
        if self._first_round_ended is None:
            self._first_round_ended = now
            return math.nan
        self._session_intervals += 1
        per_round = (now - self._first_round_ended) / self._session_intervals
        return per_round * (self.total_rounds - record.round)

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
        # A metric a strategy does not have (test-acc without a global model) is left out.
        parts = "  ".join(
            f"{k} {_fmt(row[k])}"
            for k in shown
            if not (isinstance(row[k], float) and math.isnan(row[k]))
        )
        failed = ", ".join(f"#{client} {kind}" for client, kind in record.failed.items())
        eta = self._eta_seconds(record)
        self.console.print(
            f"[bold]round {record.round}/{self.total_rounds}[/bold]  {parts}  "
            f"clients {record.replies}/{record.sampled}  {record.seconds:.1f}s"
            + (f"  ETA {duration(eta)}" if math.isfinite(eta) and eta > 0 else "")
            + (f"  failed: {failed}" if failed else "")
        )

    def _write(self) -> None:
        write_csv_atomic(self.rows, self.run_dir / METRICS_FILE)
        write_csv_atomic(self.client_rows, self.run_dir / CLIENTS_FILE)

    def state_dict(self) -> dict[str, Any]:
        """The rows so far (the checkpoint keeps them, see :mod:`fedsim.simulation.checkpoint`)."""
        return {
            "rows": self.rows,
            "client_rows": self.client_rows,
            "wall_seconds": self.wall_seconds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from checkpointed rows; the CSVs drop rows of unfinished rounds."""
        self.rows, self.client_rows = list(state["rows"]), list(state["client_rows"])
        self.earlier_seconds = float(state.get("wall_seconds", 0.0))
        self._write()


def save_model(arrays: ArrayRecord, run_dir: Path) -> None:
    # Whole or absent: a run stopped mid-write must still resume (model.pt marks it finished).
    tmp = run_dir / f"{MODEL_FILE}.tmp"
    torch.save(arrays.to_torch_state_dict(), tmp)
    os.replace(tmp, run_dir / MODEL_FILE)


def accuracy_line(last: dict[str, Any], best: float) -> str:
    """Final accuracies; strategies without a global model report only their clients'."""
    client = f"final client-eval accuracy: {_fmt(last.get('client-eval-acc', math.nan))}"
    test = last.get(protocol.TEST_ACC, math.nan)
    if math.isnan(test):
        return f"- no global model to test (personalised evaluation); {client}"
    return f"- final test accuracy: {_fmt(test)} (best {_fmt(best)}); {client}"


def write_summary(
    scenario: Scenario, rows: list[dict[str, Any]], run_dir: Path, wall_seconds: float
) -> str:
    """A short markdown summary of the run (also returned for printing).

    ``wall_seconds``: the run's true wall time (start-up, rounds, audit; every
    session of a resumed run); the rounds' own seconds are given beside it.
    """
    last = rows[-1] if rows else {}
    best = max((r.get(protocol.TEST_ACC, math.nan) for r in rows), default=math.nan)
    in_rounds = sum(r.get(protocol.SECONDS, 0.0) for r in rows)
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
        f"- wall time: {duration(wall_seconds)} ({wall_seconds:.1f}s; training and evaluation "
        f"in rounds {in_rounds:.1f}s, the rest is start-up and the audit)",
    ]
    failures = [r for r in rows if r.get(protocol.FAILURES, 0)]
    if failures:
        count = sum(int(r[protocol.FAILURES]) for r in failures)
        lines.append(f"- client failures: {count} in {len(failures)} of {len(rows)} rounds")
    lines += audit_summary_lines(run_dir)
    text = "\n".join(lines) + "\n"
    (run_dir / SUMMARY_FILE).write_text(text)
    (run_dir / RUN_INFO_FILE).write_text(json.dumps({WALL_SECONDS: wall_seconds}) + "\n")
    return text


def read_wall_seconds(run_dir: Path) -> float:
    """A finished run's true wall time (nan for a run without :data:`RUN_INFO_FILE`)."""
    path = run_dir / RUN_INFO_FILE
    if not path.is_file():
        return math.nan
    return float(json.loads(path.read_text()).get(WALL_SECONDS, math.nan))


@dataclass(frozen=True)
class VerdictTable:
    """The verdict per round: numbers (``raw``) and the same as table cells (``rows``)."""

    raw: list[dict[str, Any]]
    rows: list[dict[str, str]]


def _interval_text(low: float, high: float, digits: int = 1, scale: float = 1.0) -> str:
    if math.isnan(low) or math.isnan(high):
        return "-"
    return f"[{low * scale:.{digits}f}, {high * scale:.{digits}f}]"


def round_verdict_table(
    verdicts: pd.DataFrame, audit_seed: int, threshold: float = DEFAULT_SUCCESS_PSNR
) -> VerdictTable:
    """The verdict per round (:mod:`fedsim.outputs.verdict`) for a report or summary."""
    raw = round_verdicts(verdicts, audit_seed, threshold)
    rows = []
    for r in raw:
        victims = int(r[protocol.AUDIT_VICTIMS])
        interval = _interval_text(r[protocol.AUDIT_PSNR_LOW], r[protocol.AUDIT_PSNR_HIGH])
        share = number_text(r[protocol.AUDIT_SUCCESS], 0, 100, " %")
        bounds = (r[protocol.AUDIT_SUCCESS_LOW], r[protocol.AUDIT_SUCCESS_HIGH])
        success = f"{share} {_interval_text(*bounds, 0, 100)}"
        rows.append(
            {
                "round": str(r[protocol.ROUND]),
                "victims": str(victims),
                "psnr": number_text(r[protocol.AUDIT_PSNR]),
                "psnr-interval": interval if victims > 1 else "- (one victim)",
                "success": success,
                "ssim": number_text(r[protocol.AUDIT_SSIM], 3),
                "label-acc": number_text(r[protocol.AUDIT_LABEL_ACC], 0, 100, " %"),
                "bound": protocol.LOWER_BOUND
                if r[protocol.AUDIT_LOWER_BOUND]
                else protocol.CONVERGED,
                "strongest": str(r["strongest"]),
            }
        )
    return VerdictTable(raw, rows)


def audit_seed(run_dir: Path) -> int:
    """``audit.seed`` of a run (its bootstrap stream's seed): from its ``scenario.toml``,
    else the default's."""
    path = run_dir / SCENARIO_FILE
    tables = tomllib.loads(path.read_text()) if path.is_file() else {}
    return int(tables.get("audit", {}).get("seed", AuditConfig().seed))


def audit_summary_lines(run_dir: Path, threshold: float = DEFAULT_SUCCESS_PSNR) -> list[str]:
    """The audit in markdown: the verdict per round, then one row per attack (nothing if
    not audited)."""
    if not (run_dir / AUDIT_FILE).is_file():
        return []
    audit = pd.read_csv(run_dir / AUDIT_FILE)
    seed = audit_seed(run_dir)
    verdict = round_verdict_table(victim_verdicts(audit), seed, threshold)
    lower = any(r["bound"] == protocol.LOWER_BOUND for r in verdict.rows)
    headers = [
        "round",
        "victims",
        "verdict PSNR",
        "95 % interval",
        "success",
        "SSIM",
        "label acc.",
        "bound",
        "strongest attack",
    ]
    table = audit_table(audit, threshold)
    lines = [
        "",
        "## Privacy audit",
        "",
        "The verdict per round: for each victim the best PSNR any attack reached, then the "
        "median over the round's victims with a 95 % bootstrap interval, and the share of "
        f"victims at or above {threshold:g} dB with a Wilson interval. PSNR in dB (peak 1 on "
        "[0, 1] pixels). Per victim: `verdict.csv`.",
        "",
        tabulate([list(r.values()) for r in verdict.rows], headers, tablefmt="github"),
        "",
    ]
    if lower:
        lines += [
            "A *lower bound*: an attack in that round did not converge (`converged` in "
            "`audit.csv`); more steps could recover more.",
            "",
        ]
    lines += [
        "Single attacks (all rounds and victims):",
        "",
        "| attack | attacks | PSNR mean | median | max | success | SSIM | label acc. | converged |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r['attack']} | {r['attacks']} | {r['psnr-mean']:.2f} | {r['psnr-median']:.2f} "
            f"| {r['psnr-max']:.2f} | {r['success-rate']:.0%} | {r['ssim-mean']:.3f} "
            f"| {r['label-acc-mean']:.0%} | {number_text(r['converged-share'], 0, 100, '%')} |"
        )
    return lines
