"""Stopping a real run: SIGINT/SIGTERM stop it at a safe point with status 130 and a line
on how to resume; no Ray process of the run survives, even a driver killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
from flwr.app import ArrayRecord

from fedsim.engine.checkpoint import open_resume
from fedsim.engine.lifecycle import (
    SESSION_DIR,
    RunInterrupted,
    StopGuard,
    _stat,
    reap_orphans,
)
from fedsim.engine.loop import RoundRecord
from fedsim.engine.results import METRICS_FILE, unlock_run_dir

REPO = Path(__file__).resolve().parents[1]
# Many short rounds: the run is still going whenever the test signals it.
LONG = {
    "name": "long",
    "federation": {"num-clients": 2, "clients-per-round": 2, "rounds": 40, "seed": 0},
    "data": {"dataset": "mnist-embedded", "samples-per-client": 40},
    "model": {"name": "lenet5-split"},
    "client": {"local-steps": 1, "batch-size": 8},
    "backend": {"num-cpus": 1},
}


def _fedsim(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fedsim.cli", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _rounds_done(run_dir: Path) -> int:
    try:
        return len(pd.read_csv(run_dir / METRICS_FILE))
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return 0


def _wait_for_round(run_dir: Path, rounds: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 300
    while _rounds_done(run_dir) < rounds:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no round finished in 300 s"
        time.sleep(0.2)
    time.sleep(1.5)  # the session file is refreshed every second


def _session(pid: int) -> tuple[Path, dict[int, int]]:
    (path,) = SESSION_DIR.glob(f"driver-{pid}-*.json")
    processes = json.loads(path.read_text())["processes"]
    return path, {int(p): start for p, start in processes.items()}


def _alive(processes: dict[int, int], wait: float = 10.0) -> list[int]:
    """The recorded processes still running after up to ``wait`` seconds (SIGKILL is
    delivered asynchronously: a killed process can take a moment to go)."""
    deadline = time.monotonic() + wait
    while True:
        alive = [pid for pid, start in processes.items() if (_stat(pid) or (0, -1))[1] == start]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.mark.slow
def test_sigint_stops_and_resume_then_sigkill_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "long.toml").write_text(tomli_w.dumps(LONG))
    run_dir = tmp_path / "run"
    run = _fedsim("run", str(tmp_path / "long.toml"), "--out", str(run_dir))
    _wait_for_round(run_dir, 1, run)
    session_file, ray_processes = _session(run.pid)
    assert ray_processes  # Ray's GCS, raylet and workers were recorded

    run.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = run.communicate(timeout=120)
    stopped_after = time.monotonic() - sent

    assert run.returncode == 130
    resume_lines = [line for line in err.splitlines() if "--resume" in line]
    assert len(resume_lines) == 1, err
    resume_line = resume_lines[0]
    assert resume_line.startswith("fedsim: interrupted (SIGINT); rounds up to ")
    assert resume_line.endswith(f"continue with fedsim run --resume {run_dir}")
    # Measured 2-6 s on a busy 2-core machine (a round end, then Ray's shutdown).
    assert stopped_after < 30
    _, checkpoint = open_resume(run_dir)
    unlock_run_dir(run_dir)  # opening took the folder's lock for this process: the resume needs it
    assert checkpoint.round == _rounds_done(run_dir) >= 1
    assert not _alive(ray_processes)
    assert not session_file.exists()

    # Resume, then kill the driver outright: its Ray processes are reaped by the next run.
    resumed = _fedsim("run", "--resume", str(run_dir))
    _wait_for_round(run_dir, checkpoint.round + 1, resumed)
    session_file, ray_processes = _session(resumed.pid)
    resumed.kill()
    resumed.wait(timeout=30)

    reap_orphans()

    assert not _alive(ray_processes)
    assert not session_file.exists()


def test_sigterm_and_sigint_ask_for_a_stop_at_the_next_round_end(tmp_path: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        guard = StopGuard(tmp_path, grace=60.0)
        with guard.installed():
            os.kill(os.getpid(), sig)
            time.sleep(0.1)  # the handler runs between bytecodes of the main thread
        assert guard.stop.is_set() and guard.signal_name == sig.name
        record = RoundRecord(round=3, seconds=0.0, sampled=2, replies=2, failures=0)
        guard.begin_outputs.on_round_end(record, ArrayRecord())
        with pytest.raises(RunInterrupted, match=f"rounds up to 3 are saved.*--resume {tmp_path}"):
            guard.end_outputs.on_round_end(record, ArrayRecord())


def test_the_forced_stop_waits_out_the_grace_only_while_the_run_lasts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forced: list[StopGuard] = []
    monkeypatch.setattr(StopGuard, "_force", lambda guard: forced.append(guard))
    lingering = StopGuard(tmp_path, grace=0.2)
    with lingering.installed():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.6)  # no round ended within the grace: the stop is forced
    assert forced == [lingering]

    finished = StopGuard(tmp_path, grace=0.2)
    with finished.installed():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    time.sleep(0.6)  # the run ended before the grace: nothing is forced later
    assert forced == [lingering]
