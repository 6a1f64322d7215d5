"""Stopping a real run: SIGINT/SIGTERM stop it at a safe point with status 130 and a line
on how to resume; no Ray process of the run survives, even a driver killed with SIGKILL."""

from __future__ import annotations

import contextlib
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
from processes import fedsim, in_session, left, ray_driver_log, wait_for_ray_start

from fedsim.cli import main as cli_main
from fedsim.core.protocol import RoundRecord
from fedsim.outputs.run_folder import METRICS_FILE, unlock_run_dir
from fedsim.simulation.children import ChildRuns
from fedsim.simulation.lifecycle import SESSION_DIR, RunInterrupted, StopGuard, reap_orphans
from fedsim.simulation.procfs import descendants, proc_stat
from fedsim.simulation.resume import open_resume

# Many short rounds: the run is still going whenever the test signals it.
# Long enough that no run finishes before the test interrupts it: rounds of one local step
# take well under a second, and a sweep whose runs all finished exits 0 (seen in CI at 40).
LONG = {
    "name": "long",
    "federation": {"num-clients": 2, "clients-per-round": 2, "rounds": 400, "seed": 0},
    "data": {"dataset": "mnist-embedded", "samples-per-client": 40},
    "model": {"name": "lenet5-split"},
    "client": {"local-steps": 1, "batch-size": 8},
    "backend": {"num-cpus": 1},
}


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
        alive = [pid for pid, start in processes.items() if (proc_stat(pid) or (0, -1))[1] == start]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.mark.slow
def test_sigint_stops_and_resume_then_sigkill_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "long.toml").write_text(tomli_w.dumps(LONG))
    run_dir = tmp_path / "run"
    run = fedsim("run", str(tmp_path / "long.toml"), "--out", str(run_dir))
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

    # Resume, then kill the driver outright: what it started (Ray's dashboard and
    # runtime-env agents would outlive it by a minute) is reaped at once.
    resumed = fedsim("run", "--resume", str(run_dir))
    _wait_for_round(run_dir, checkpoint.round + 1, resumed)
    session_file, ray_processes = _session(resumed.pid)
    resumed.kill()
    resumed.wait(timeout=30)
    assert not _alive(ray_processes, wait=15)
    # SIGKILL can land between a round's metrics row and its checkpoint: what is
    # saved is the checkpoint's round (a resume drops the unfinished round's rows).
    _, killed_at = open_resume(run_dir)
    unlock_run_dir(run_dir)
    assert killed_at.round <= _rounds_done(run_dir) <= killed_at.round + 1
    following = fedsim("run", "--resume", str(run_dir))
    started = time.monotonic()
    wait_for_ray_start(following)  # the killed run's processes were reaped just before

    assert not in_session(resumed.pid)
    assert not session_file.exists()
    # Measured 10-30 s on a busy 2-core machine (imports and validation come first).
    assert time.monotonic() - started < 120

    # Ctrl-C while Ray starts: one line, status 130, nothing left running.
    os.killpg(following.pid, signal.SIGINT)
    _, err = following.communicate(timeout=60)
    assert following.returncode == 130
    assert err.splitlines() == [
        f"fedsim: interrupted (SIGINT); rounds up to {killed_at.round} are saved: "
        f"continue with fedsim run --resume {run_dir}"
    ], err
    assert not left(following.pid, wait=10)


def test_sigterm_and_sigint_ask_for_a_stop_at_the_next_round_end(tmp_path: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        guard = StopGuard(tmp_path, grace=60.0)
        with guard.installed(), guard.rounds():
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
    with lingering.installed(), lingering.rounds():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.6)  # no round ended within the grace: the stop is forced
    assert forced == [lingering]

    finished = StopGuard(tmp_path, grace=0.2)
    with finished.installed(), finished.rounds():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    time.sleep(0.6)  # the run ended before the grace: nothing is forced later
    assert forced == [lingering]


def test_outside_the_rounds_a_signal_stops_the_run_at_once(tmp_path: Path) -> None:
    for run_dir, said in [(None, "while starting; nothing written"), (tmp_path, "first round")]:
        guard = StopGuard(run_dir)
        with pytest.raises(RunInterrupted) as stop, guard.installed():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
        assert said in str(stop.value) and stop.value.signal_name == "SIGTERM"


def _child_runs(sweep: subprocess.Popen[str]) -> list[int]:
    """The ``fedsim run`` processes a parallel sweep runs."""
    children = []
    for pid in descendants(sweep.pid):
        with contextlib.suppress(OSError):  # it ended meanwhile
            if b"fedsim.cli\x00run" in Path(f"/proc/{pid}/cmdline").read_bytes():
                children.append(pid)
    return children


def _wait_for_rounds(
    run_dirs: list[Path], beyond: dict[Path, int], sweep: subprocess.Popen[str]
) -> list[int]:
    """Until every run in ``run_dirs`` has finished a round after ``beyond``'s; the
    sweep's child runs then."""
    deadline = time.monotonic() + 300
    while True:
        assert sweep.poll() is None, sweep.communicate()
        children = _child_runs(sweep)
        if all(_rounds_done(d) > beyond.get(d, 0) for d in run_dirs):
            return children
        assert time.monotonic() < deadline, "no round finished in 300 s"
        time.sleep(0.2)


@pytest.mark.slow  # two sweeps of two runs with a Ray each: 3-4 minutes on a busy 2-core machine
def test_a_parallel_sweep_killed_or_interrupted_leaves_nothing_and_continues(
    tmp_path: Path,
) -> None:
    (tmp_path / "long.toml").write_text(tomli_w.dumps(LONG))
    spec = tmp_path / "spec.toml"
    spec.write_text(
        tomli_w.dumps(
            {
                "name": "par",
                "base": "long.toml",
                "seeds": [0, 1],
                "parallel": 2,
                "overrides": {"backend": {"ray-cpus": 1}},
            }
        )
    )
    out = tmp_path / "sweep"
    run_dirs = [out / "runs" / "fedavg" / f"seed-{seed}" for seed in (0, 1)]

    # SIGKILL to the sweep: its child runs stop at their round end (SIGTERM from the kernel).
    sweep = fedsim("compare", str(spec), "--out", str(out))
    children = _wait_for_rounds(run_dirs, {}, sweep)
    assert len(children) == 2
    sweep.kill()
    sweep.wait(timeout=30)
    for child in children:
        assert not left(child, wait=60)  # measured under 1 s
    for run_dir in run_dirs:
        log = run_dir.with_suffix(".log").read_text()
        why = "\n".join(ray_driver_log(child) for child in children)  # if a child vanished
        assert "fedsim: interrupted (SIGTERM); rounds up to" in log, f"{log}\n{why}"

    # The next sweep continues both; Ctrl-C to it stops them once each, in one line, even
    # when it started with SIGINT ignored, as a background job (where CI failed before).
    done = {d: _rounds_done(d) for d in run_dirs}
    sweep = fedsim("compare", str(spec), "--out", str(out), sigint_ignored=True)
    children = _wait_for_rounds(run_dirs, done, sweep)
    os.killpg(sweep.pid, signal.SIGINT)
    said, err = sweep.communicate(timeout=120)

    assert sweep.returncode == 130
    assert "2 to run (2 continuing)" in said
    assert "Traceback" not in said + err
    assert said.splitlines()[-1] == (
        "fedsim: interrupted (SIGINT); finished runs and completed rounds are saved: "
        f"continue with fedsim compare {spec} --out {out}"
    )
    for child in children:
        assert not left(child, wait=60)
    for run_dir in run_dirs:
        log = run_dir.with_suffix(".log").read_text().splitlines()
        assert log[-1].startswith("fedsim: interrupted (SIGINT); rounds up to"), log[-3:]
    assert not left(sweep.pid, wait=10)


def test_a_child_run_ends_with_the_sweep_that_started_it() -> None:
    child = (
        "import os, time; from fedsim.simulation.children import end_with_parent; "
        "end_with_parent(); print(os.getpid(), os.getsid(0), flush=True); time.sleep(60)"
    )
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from fedsim.simulation.children import ChildRuns; "
            f"ChildRuns().run([sys.executable, '-c', {child!r}], sys.stdout)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sweep.stdout is not None
    pid, sid = map(int, sweep.stdout.readline().split())
    start = (proc_stat(pid) or (0, -1))[1]

    sweep.kill()
    sweep.wait(timeout=10)

    assert sid == pid  # its own session: a Ctrl-C to the sweep's group does not reach it
    assert not _alive({pid: start}, wait=10)  # SIGTERM from the kernel when the sweep died


def test_an_interrupted_sweep_starts_no_more_child_runs() -> None:
    children = ChildRuns()
    children.interrupt()

    assert children.run([sys.executable, "-c", "raise SystemExit(0)"], sys.stdout) == 130


def test_a_driver_killed_with_sigkill_leaves_nothing_running() -> None:
    # A driver whose recorded process (as Ray's agents) is outside its group: no
    # later run is started, yet the process is gone once the driver is.
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "from fedsim.simulation.lifecycle import RaySession\n"
            "from fedsim.simulation.procfs import proc_stat\n"
            "agent = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
            " start_new_session=True)\n"
            "session = RaySession(scan=lambda pid: {agent.pid: proc_stat(agent.pid)[1]})\n"
            "with session.watching():\n"
            "    session.record()\n"
            "    print(agent.pid, proc_stat(agent.pid)[1], flush=True)\n"
            "    time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert driver.stdout is not None
    agent, start = map(int, driver.stdout.readline().split())

    driver.kill()
    driver.wait(timeout=10)

    assert not _alive({agent: start}, wait=10)  # measured well under 1 s


def test_a_stop_by_sigterm_exits_143_and_by_sigint_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedsim.commands.run import RunCommand

    for name, status in [("SIGTERM", 143), ("SIGINT", 130)]:

        def stopped(self: RunCommand, args: object, name: str = name) -> int:
            raise RunInterrupted(name, None, 0)

        monkeypatch.setattr(RunCommand, "run", stopped)
        assert cli_main(["run", "x.toml"]) == status
        said = f"fedsim: interrupted ({name}) while starting; nothing written: run again\n"
        assert capsys.readouterr().err == said


def test_reaping_kills_the_unrecorded_rest_of_a_dead_drivers_group() -> None:
    # A group leader that started a child and died before any scan recorded it.
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); print(c.pid, flush=True)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert leader.stdout is not None
    straggler = int(leader.stdout.readline())
    start = (proc_stat(straggler) or (0, -1))[1]
    leader.wait(timeout=10)
    SESSION_DIR.mkdir(parents=True, exist_ok=True)
    record = {"driver": [leader.pid, 0], "group-leader": True, "run-dir": "", "processes": {}}
    (SESSION_DIR / f"driver-{leader.pid}-0.json").write_text(json.dumps(record))

    killed = reap_orphans()

    assert straggler in killed
    assert not _alive({straggler: start}, wait=0)  # reaping waited until it was gone
