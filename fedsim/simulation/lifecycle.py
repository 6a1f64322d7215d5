"""A run's life cycle outside the rounds: stopping on a signal, and Ray processes reaped.

**Stopping.** While the rounds run, the first SIGINT or SIGTERM asks the run
to stop: the round loop stops at the next round end, after that round's
outputs and checkpoint are written (:class:`StopGuard`'s two callbacks bracket
the writing). If no round ends within ``grace`` seconds (or at a second
signal), the run is stopped at once, but never while a round's outputs are
being written: everything up to the last checkpoint is kept, and ``fedsim run
--resume`` continues from it. Before the rounds (Ray starting) and after them
(final model, summary) a signal stops the run at once, with the same one-line
:class:`RunInterrupted`: nothing there needs a round end.

**Ray processes.** A run records the processes its driver started (Ray's GCS,
raylet, workers: the driver's descendants, read from ``/proc``) in a session
file under the temporary folder while it runs, and kills what is left when it
ends. A driver killed with SIGKILL cannot; the next run (or ``--resume``, or
``fedsim compare``) reaps the sessions whose driver is gone
(:func:`reap_orphans`) and waits until they are: nothing of the killed run is
left once the next one starts. A process is killed only if its PID still has
the start time recorded (PIDs are reused); a driver that led its process group
also has the rest of its group killed (processes it started in its last
second, before a scan recorded them), as the kernel gives no new process the
group's number while a member lives.

**Child runs** of a parallel sweep are :mod:`fedsim.simulation.children`'s;
what the process table says, :mod:`fedsim.simulation.procfs`'s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from fedsim.simulation.procfs import (
    group_members,
    kill_recorded,
    proc_stat,
    ray_descendants,
    wait_gone,
)

if TYPE_CHECKING:  # the command line imports this module: keep Flower out of its start-up
    from flwr.app import ArrayRecord

    from fedsim.core.protocol import RoundRecord

INTERRUPTED_STATUS = 130  # the shell's status for a run stopped by SIGINT
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_STATUSES = tuple(128 + sig for sig in STOP_SIGNALS)  # 130 and 143
SESSION_DIR = Path(tempfile.gettempdir()) / f"fedsim-sessions-{os.getuid()}"
RECORD_EVERY = 1.0  # seconds between scans of the driver's descendants
REAP_TIMEOUT = 10.0  # seconds to wait for killed orphans to end (measured: well under 1)


def signal_status(signal_name: str) -> int:
    """128 + the number of ``signal_name`` (``"SIGTERM"``: 143); :data:`INTERRUPTED_STATUS`
    for a name that is no signal's."""
    try:
        return 128 + signal.Signals[signal_name].value
    except KeyError:
        return INTERRUPTED_STATUS


class RunInterrupted(KeyboardInterrupt):
    """The run stopped on a signal; completed rounds are checkpointed.

    A ``KeyboardInterrupt``: code that carries on after an ``Exception`` (a
    sweep going on to its next run) stops too. ``run_dir`` is None when the
    signal came before the run folder was made.
    """

    def __init__(self, signal_name: str, run_dir: Path | None, last_round: int) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.run_dir = run_dir
        self.last_round = last_round

    @property
    def status(self) -> int:
        """The exit status a stop by this signal gets: 128 + its number, as a shell's
        (130 for SIGINT, 143 for SIGTERM; 130 when the signal is not named)."""
        return signal_status(self.signal_name)

    def __str__(self) -> str:
        if self.run_dir is None:
            return f"interrupted ({self.signal_name}) while starting; nothing written: run again"
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
    file and :attr:`end_outputs` its last one. ``run_dir`` is set once the run
    folder exists.
    """

    run_dir: Path | None = None
    grace: float = 5.0
    on_force: Callable[[], object] = lambda: None  # cleans up before a forced exit
    stop: threading.Event = field(default_factory=threading.Event)
    signal_name: str = ""
    last_round: int = 0
    _writing: threading.Lock = field(default_factory=threading.Lock)
    _watchdog: threading.Thread | None = None
    _left: threading.Event = field(default_factory=threading.Event)  # the rounds ended
    _in_rounds: bool = False
    _installed: bool = False  # the handlers are this guard's (main thread only)

    @contextmanager
    def installed(self) -> Iterator[StopGuard]:
        """Handle the stop signals inside the block (main thread only; else a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        self._installed = True
        try:
            yield self
        finally:
            self._installed = False
            self._left.set()  # the run ended on its own: no forced exit after the grace
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def reclaim(self) -> None:
        """Take the stop signals back: ``ray.init`` installs a SIGTERM handler of its own
        in the driver (it logs and lets the run go on)."""
        if self._installed:
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._handle)

    @contextmanager
    def rounds(self) -> Iterator[None]:
        """Inside, a signal stops the run at the next round end; outside, at once."""
        self._in_rounds = True
        try:
            yield
        finally:
            self._in_rounds = False
            self._left.set()  # no round end left to wait for: no forced exit after the grace

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.stop.is_set():  # a second signal: stop now
            threading.Thread(target=self._force, daemon=True).start()
            return
        self.signal_name = signal.Signals(signum).name
        self.stop.set()
        if not self._in_rounds:  # raised in the main thread, where it was interrupted
            raise self.interrupted()
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
        stop = self.interrupted()
        # Said before the clean-up: Ray's driver may end this process as soon as its
        # raylet is killed (a forced child run of a sweep once ended without its line).
        print(f"fedsim: {stop}", file=sys.stderr, flush=True)
        self.on_force()
        os._exit(stop.status)

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


@dataclass
class RaySession:
    """Records the driver's Ray processes while a run lasts; kills the rest at the end.

    ``run_dir`` is set once the run folder exists (Ray starts before it: a
    refused resource split leaves no folder behind). ``scan`` finds what to
    record below the driver: Ray's processes (a run), or a parallel sweep's
    child runs and theirs (:meth:`fedsim.simulation.children.ChildRuns.processes`).
    """

    run_dir: Path | None = None
    scan: Callable[[int], dict[int, int]] = ray_descendants
    # Kill the recorded processes as soon as the driver dies (start_reaper); a sweep's
    # child runs are not: they stop at their round end by themselves, checkpointed.
    reap_on_death: bool = True
    path: Path = field(init=False)
    processes: dict[int, int] = field(default_factory=dict)
    _done: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        pid = os.getpid()
        start = proc_stat(pid)
        self.path = SESSION_DIR / f"driver-{pid}-{start[1] if start else 0}.json"

    def record(self) -> None:
        """Add the driver's current descendants to the session file."""
        now = self.scan(os.getpid())
        if now.items() - self.processes.items():
            self.processes.update(now)
            driver = proc_stat(os.getpid())
            record = {
                "driver": [os.getpid(), driver[1] if driver else 0],
                "group-leader": os.getpgrp() == os.getpid(),
                "run-dir": str(self.run_dir or ""),
                "reap": self.reap_on_death,
                "processes": {str(pid): start for pid, start in self.processes.items()},
            }
            SESSION_DIR.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            tmp.replace(self.path)

    def _record_loop(self) -> None:
        while not self._done.wait(RECORD_EVERY):
            self.record()

    def kill_remaining(self) -> dict[int, int]:
        """Kill every recorded process still alive (the run is over or forced to stop)."""
        self._done.set()
        self.record()
        killed = kill_recorded(self.processes)
        with suppress(FileNotFoundError):
            self.path.unlink()
        return killed

    @contextmanager
    def watching(self) -> Iterator[RaySession]:
        self._thread = threading.Thread(target=self._record_loop, daemon=True)
        self._thread.start()
        reaper = start_reaper() if self.reap_on_death else None
        try:
            yield self
        finally:
            self.kill_remaining()
            if reaper is not None:
                with suppress(subprocess.TimeoutExpired):  # closing its stdin ends it
                    reaper.communicate(timeout=REAP_TIMEOUT)


def start_reaper() -> subprocess.Popen[bytes]:
    """A small process that reaps this driver's Ray processes as soon as the driver dies.

    A driver killed with SIGKILL cannot kill what it started, and Ray's dashboard and
    runtime-env agents only notice their raylet is gone about a minute later. The
    reaper holds the read end of a pipe whose only writer is this process (Python's
    pipes are not inherited by Ray's processes): the kernel closes it when the driver
    dies, however it dies, and the reaper then runs :func:`reap_orphans`. It has a
    session of its own, so a Ctrl-C to the driver's group or a reap of it spares it.
    """
    return subprocess.Popen(
        [sys.executable, "-c", f"from {__name__} import reap_at_eof; reap_at_eof()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def reap_at_eof() -> None:
    """The reaper's body (:func:`start_reaper`): wait for the end of stdin, then reap."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    reap_orphans()


def _orphans(record: dict[str, Any]) -> dict[int, int] | None:
    """What a session file's dead driver left (recorded processes, and its process
    group if it led one); None while the driver runs."""
    driver_pid, driver_start = record["driver"]
    alive = proc_stat(driver_pid)
    if alive is not None and alive[1] == driver_start:
        return None  # a run still going
    if not record.get("reap", True):
        # A killed sweep's child runs stop at their round end by themselves (and each
        # run's own reaper takes its Ray processes): reaping them here killed one still
        # stopping as soon as its sibling's reaper ran.
        return {}
    processes = {int(pid): start for pid, start in record["processes"].items()}
    # A group's number is never given to a new process while a member lives: with
    # no process of that pid, the group's members are the driver's.
    if record.get("group-leader") and alive is None:
        processes.update(group_members(driver_pid))
        processes.pop(os.getpid(), None)  # never this process, should it have joined that group
    return processes


def reap_orphans(timeout: float = REAP_TIMEOUT) -> dict[int, int]:
    """Kill the processes of earlier runs whose driver is gone (e.g. killed with SIGKILL),
    and wait up to ``timeout`` s until they are.

    Repeated until a pass finds nothing: a killed sweep's child runs are drivers
    too, and their own sessions are orphans once they are killed.
    """
    killed: dict[int, int] = {}
    while SESSION_DIR.is_dir():
        found: dict[int, int] = {}
        for path in SESSION_DIR.glob("driver-*.json"):
            try:
                processes = _orphans(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError):  # half-written or foreign
                continue
            if processes is None:
                continue
            found.update(kill_recorded(processes))
            with suppress(FileNotFoundError):
                path.unlink()
        wait_gone(found, timeout)
        if not found:
            break
        killed.update(found)
    return killed
