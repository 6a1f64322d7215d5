"""A parallel sweep's child runs: each ``fedsim run`` in a process of its own.

A parallel ``fedsim compare`` starts each run as ``fedsim run`` in its own
session (:class:`ChildRuns`): a Ctrl-C reaches a child once, from the driver,
not twice (the second would force its stop). A child ends with its driver: it
asks the kernel for SIGTERM when the driver dies (:func:`end_with_parent`),
and the driver's session file lists the children for the next run to reap
(:class:`fedsim.simulation.lifecycle.RaySession`, scanning with
:meth:`ChildRuns.processes`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from contextlib import suppress
from dataclasses import dataclass, field
from typing import IO, Any

from fedsim.simulation.lifecycle import INTERRUPTED_STATUS
from fedsim.simulation.procfs import descendants, proc_stat

PARENT_ENV = "FEDSIM_END_WITH_PARENT"  # a sweep's pid, in the environment of its child runs
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_parent() -> None:
    """In a child run of a sweep (:class:`ChildRuns`), ask for SIGTERM when the sweep dies.

    The kernel sends it when the thread that started this process ends; the
    sweep's thread waits for its child, so that is when the sweep itself dies.
    SIGTERM stops the run as Ctrl-C does (see :class:`fedsim.simulation.lifecycle.StopGuard`).
    """
    parent = os.environ.pop(PARENT_ENV, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # the sweep died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class ChildRuns:
    """Commands a sweep runs in processes of their own (see the module docstring)."""

    _running: set[subprocess.Popen[bytes]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _interrupted: bool = False

    def run(self, command: list[str], log: IO[Any]) -> int:
        """Run ``command`` with its output in ``log``; its exit status
        (:data:`INTERRUPTED_STATUS` without starting it once :meth:`interrupt` was called)."""
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        with self._lock:  # no child may start between an interrupt and its signals
            if self._interrupted:
                return INTERRUPTED_STATUS
            child = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            self._running.add(child)
        try:
            return child.wait()
        finally:
            with self._lock:
                self._running.discard(child)

    def processes(self, driver: int) -> dict[int, int]:
        """The running children and their descendants (a
        :class:`~fedsim.simulation.lifecycle.RaySession` scan)."""
        with self._lock:
            pids = [child.pid for child in self._running]
        found: dict[int, int] = {}
        for pid in pids:
            if (stat := proc_stat(pid)) is not None:
                found[pid] = stat[1]
                found.update(descendants(pid))
        return found

    def interrupt(self) -> None:
        """SIGINT to every running child (each stops at its next round end); start no more."""
        with self._lock:
            self._interrupted = True
            for child in self._running:
                with suppress(ProcessLookupError):
                    child.send_signal(signal.SIGINT)
