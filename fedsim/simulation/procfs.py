"""Processes as Linux's ``/proc`` shows them: parent, start time, group, descendants.

A process is named by its PID and its start time together (PIDs are reused):
a recorded process is killed, or waited for, only while its PID still has the
start time recorded. :mod:`fedsim.simulation.lifecycle` records and reaps a
run's Ray processes with these; :mod:`fedsim.simulation.children` a sweep's
child runs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path


def _fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after ``pid (comm)``: state, ppid, pgrp, ...; None if ``pid``
    is gone (or a zombie: dead, waiting for its parent to collect its status)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields


def proc_stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, start time)`` of ``pid``; None if it is gone (see :func:`_fields`)."""
    fields = _fields(pid)
    return None if fields is None else (int(fields[1]), int(fields[19]))


def _live_pids() -> Iterator[int]:
    return (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())


def group_members(pgid: int) -> dict[int, int]:
    """Every live process in process group ``pgid``: pid -> start time."""
    members = {}
    for pid in _live_pids():
        fields = _fields(pid)
        if fields is not None and int(fields[2]) == pgid:
            members[pid] = int(fields[19])
    return members


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
    for pid in _live_pids():
        if (stat := proc_stat(pid)) is not None:
            children.setdefault(stat[0], []).append(pid)
            started[pid] = stat[1]
    found: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found and pid in started:
            found[pid] = started[pid]
            todo.extend(children.get(pid, []))
    return found


def _alive(processes: dict[int, int]) -> dict[int, int]:
    """The processes still running with their recorded start time."""
    return {
        pid: start
        for pid, start in processes.items()
        if (stat := proc_stat(pid)) is not None and stat[1] == start
    }


def kill_recorded(processes: dict[int, int]) -> dict[int, int]:
    """SIGKILL each recorded process still alive with its recorded start time."""
    killed = {}
    for pid, start in _alive(processes).items():
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed[pid] = start
    return killed


def wait_gone(processes: dict[int, int], timeout: float) -> dict[int, int]:
    """Wait up to ``timeout`` s for ``processes`` to end; those still running.

    SIGKILL takes effect asynchronously: a killed process may hold its files
    (a run folder's lock) for a moment.
    """
    deadline = time.monotonic() + timeout
    while (alive := _alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive
