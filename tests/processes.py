"""Real ``fedsim`` processes for the signal tests: started in a session of their own, as
a shell starts a job (a Ctrl-C is a SIGINT to the process group), and what they leave
counted by session, so that a process that left its group or was never recorded counts.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fedsim(*args: str, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    """``fedsim ARGS`` in a new session on this machine; its output piped. With
    ``sigint_ignored``, it starts with SIGINT ignored, as a shell's background job does."""
    command = [sys.executable, "-m", "fedsim.cli", *args]
    if sigint_ignored:
        command = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *command]
    return subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def in_session(sid: int) -> dict[int, bytes]:
    """Every live process of session ``sid``: pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            text = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except (OSError, NotADirectoryError):
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X") and int(fields[3]) == sid:
            found[int(entry.name)] = command
    return found


def left(sid: int, wait: float) -> dict[int, bytes]:
    """What session ``sid`` still runs after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while (alive := in_session(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def wait_for_ray_start(process: subprocess.Popen[str]) -> None:
    """Until ``process`` is starting Ray (its GCS is up; the raylet may not be)."""
    deadline = time.monotonic() + 300
    while not any(b"gcs_server" in cmd for cmd in in_session(process.pid).values()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "Ray did not start in 300 s"
        time.sleep(0.05)


def ray_driver_log(pid: int, lines: int = 15) -> str:
    """The last ``lines`` of Ray's core-driver log of the driver ``pid`` (Ray writes one
    per driver, named by its pid): why Ray ended a driver, should it have."""
    logs = sorted(Path("/tmp/ray").glob(f"session_*/logs/python-core-driver-*_{pid}.log"))
    if not logs:
        return f"(no Ray driver log for pid {pid})"
    tail = logs[-1].read_text(errors="replace").splitlines()[-lines:]
    return f"{logs[-1]}:\n" + "\n".join(tail)
