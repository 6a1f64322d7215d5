"""A run's life cycle outside the rounds: stopping on a signal, and Ray processes reaped.

**Stopping.** The first SIGINT or SIGTERM asks the run to stop: the round loop
stops at the next round end, after that round's outputs and checkpoint are
written (:class:`StopGuard`'s two callbacks bracket the writing). If no round
ends within ``grace`` seconds (or at a second signal), the run is stopped at
once, but never while a round's outputs are being written: everything up to
the last checkpoint is kept, and ``fedsim run --resume`` continues from it.

**Ray processes.** A run records the processes its driver started (Ray's GCS,
raylet, workers: the driver's descendants, read from ``/proc``) in a session
file under the temporary folder while it runs, and kills what is left when it
ends. A driver killed with SIGKILL cannot; the next run (or ``--resume``)
reaps the sessions whose driver is gone (:func:`reap_orphans`). A process is
killed only if its PID still has the start time recorded (PIDs are reused).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command line imports this module: keep Flower out of its start-up
    from flwr.app import ArrayRecord

    from fedsim.engine.loop import RoundRecord

INTERRUPTED_STATUS = 130  # the shell's status for a run stopped by SIGINT
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SESSION_DIR = Path(tempfile.gettempdir()) / f"fedsim-sessions-{os.getuid()}"
RECORD_EVERY = 1.0  # seconds between scans of the driver's descendants


class RunInterrupted(KeyboardInterrupt):
    """The run stopped on a signal; completed rounds are checkpointed.

    A ``KeyboardInterrupt``: code that carries on after an ``Exception`` (a
    sweep going on to its next run) stops too.
    """

    def __init__(self, signal_name: str, run_dir: Path, last_round: int) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.run_dir = run_dir
        self.last_round = last_round

    def __str__(self) -> str:
        if not self.last_round:
            return (
                f"interrupted ({self.signal_name}) before the first round ended; nothing to "
                f"resume: run again (--force reuses {self.run_dir})"
            )
        return (
            f"interrupted ({self.signal_name}); rounds up to {self.last_round} are saved: "
            f"continue with fedsim run --resume {self.run_dir}"
        )


# -- stopping ------------------------------------------------------------------------


@dataclass
class StopGuard:
    """Turns SIGINT/SIGTERM into a stop at a safe point (see the module docstring).

    :attr:`begin_outputs` must be the round's first callback that writes a
    file and :attr:`end_outputs` its last one.
    """

    run_dir: Path
    grace: float = 5.0
    on_force: Callable[[], object] = lambda: None  # cleans up before a forced exit
    stop: threading.Event = field(default_factory=threading.Event)
    signal_name: str = ""
    last_round: int = 0
    _writing: threading.Lock = field(default_factory=threading.Lock)
    _watchdog: threading.Thread | None = None
    _left: threading.Event = field(default_factory=threading.Event)  # the guarded block ended

    @contextmanager
    def installed(self) -> Iterator[StopGuard]:
        """Handle the stop signals inside the block (main thread only; else a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        try:
            yield self
        finally:
            self._left.set()  # the run ended on its own: no forced exit after the grace
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.stop.is_set():  # a second signal: stop now
            threading.Thread(target=self._force, daemon=True).start()
            return
        self.signal_name = signal.Signals(signum).name
        self.stop.set()
        print(
            f"fedsim: {self.signal_name} received; stopping at the end of this round "
            f"(at most {self.grace:g}s; signal again to stop now)",
            file=sys.stderr,
            flush=True,
        )
        self._watchdog = threading.Thread(target=self._force_after_grace, daemon=True)
        self._watchdog.start()

    def _force_after_grace(self) -> None:
        if not self._left.wait(self.grace):
            self._force()

    def _force(self) -> None:
        # Wait for a round's outputs to be complete, and keep the lock: none start again.
        self._writing.acquire()
        self.on_force()
        print(f"fedsim: {self.interrupted()}", file=sys.stderr, flush=True)
        os._exit(INTERRUPTED_STATUS)

    def interrupted(self) -> RunInterrupted:
        return RunInterrupted(self.signal_name or "signal", self.run_dir, self.last_round)

    @property
    def begin_outputs(self) -> _BeginOutputs:
        return _BeginOutputs(self)

    @property
    def end_outputs(self) -> _EndOutputs:
        return _EndOutputs(self)


@dataclass
class _BeginOutputs:
    guard: StopGuard

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> None:
        self.guard._writing.acquire()


@dataclass
class _EndOutputs:
    guard: StopGuard

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> None:
        self.guard.last_round = record.round
        self.guard._writing.release()
        if self.guard.stop.is_set():
            raise self.guard.interrupted()


# -- Ray processes ---------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, start time)`` of ``pid`` from ``/proc``; None if it is gone
    (or a zombie: dead, waiting for its parent to collect its status)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def _is_ray(pid: int) -> bool:
    try:
        return b"ray" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def ray_descendants(root: int) -> dict[int, int]:
    """Ray's processes below ``root`` (GCS, raylet, workers, ...): pid -> start time."""
    return {pid: start for pid, start in descendants(root).items() if _is_ray(pid)}


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root``: pid -> start time (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
            started[int(entry.name)] = stat[1]
    found: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found and pid in started:
            found[pid] = started[pid]
            todo.extend(children.get(pid, []))
    return found


def _kill_recorded(processes: dict[int, int]) -> list[int]:
    """SIGKILL each recorded process still alive with its recorded start time."""
    killed = []
    for pid, start in processes.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == start:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


@dataclass
class RaySession:
    """Records the driver's Ray processes while a run lasts; kills the rest at the end.

    ``run_dir`` is set once the run folder exists (Ray starts before it: a
    refused resource split leaves no folder behind).
    """

    run_dir: Path | None = None
    path: Path = field(init=False)
    processes: dict[int, int] = field(default_factory=dict)
    _done: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        pid = os.getpid()
        start = _stat(pid)
        self.path = SESSION_DIR / f"driver-{pid}-{start[1] if start else 0}.json"

    def record(self) -> None:
        """Add the driver's current descendants to the session file."""
        now = ray_descendants(os.getpid())
        if now.items() - self.processes.items():
            self.processes.update(now)
            driver = _stat(os.getpid())
            record = {
                "driver": [os.getpid(), driver[1] if driver else 0],
                "run-dir": str(self.run_dir or ""),
                "processes": {str(pid): start for pid, start in self.processes.items()},
            }
            SESSION_DIR.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            tmp.replace(self.path)

    def _record_loop(self) -> None:
        while not self._done.wait(RECORD_EVERY):
            self.record()

    def kill_remaining(self) -> list[int]:
        """Kill every recorded process still alive (the run is over or forced to stop)."""
        self._done.set()
        self.record()
        killed = _kill_recorded(self.processes)
        with suppress(FileNotFoundError):
            self.path.unlink()
        return killed

    @contextmanager
    def watching(self) -> Iterator[RaySession]:
        self._thread = threading.Thread(target=self._record_loop, daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self.kill_remaining()


def reap_orphans() -> list[int]:
    """Kill the processes of earlier runs whose driver is gone (e.g. killed with SIGKILL)."""
    killed: list[int] = []
    if not SESSION_DIR.is_dir():
        return killed
    for path in SESSION_DIR.glob("driver-*.json"):
        try:
            record: dict[str, Any] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        driver_pid, driver_start = record["driver"]
        alive = _stat(driver_pid)
        if alive is not None and alive[1] == driver_start:
            continue  # a run still going
        processes = {int(pid): start for pid, start in record["processes"].items()}
        killed += _kill_recorded(processes)
        with suppress(FileNotFoundError):
            path.unlink()
    return killed
