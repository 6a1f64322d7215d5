"""Headless Chromium driven over the DevTools protocol (for the report tests).

Chromium is started by the test on 127.0.0.1 (``--remote-debugging-port=0``:
it picks a free port and writes it to ``DevToolsActivePort`` in its profile),
driven through one page's WebSocket with ``websockets``, and torn down by PID
(its whole process group).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
    "--window-size=1200,900",
)


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One browser tab: ``call`` sends a DevTools command and returns its result."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self._ids = count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:  # events arrive in between; skip them
            reply = json.loads(self.socket.recv(timeout=60))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply["result"])

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def open(self, url: str, timeout: float = 30.0) -> None:
        """Navigate and wait until the document and every image finished loading."""
        self.call("Page.navigate", url=url)
        ready = "document.readyState === 'complete' && [...document.images].every(i => i.complete)"
        deadline = time.monotonic() + timeout
        while not self.evaluate(f"location.href === {json.dumps(url)} && {ready}"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish loading in {timeout}s")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> None:
        """The whole page as a PNG at ``path``."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))


def _devtools_port(profile: Path, process: subprocess.Popen[bytes], timeout: float) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while not marker.is_file() or not marker.read_text().strip():
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with status {process.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError("chromium did not open its DevTools port")
        time.sleep(0.1)
    return int(marker.read_text().splitlines()[0])


@contextmanager
def chromium_page(profile: Path, timeout: float = 60.0) -> Iterator[Page]:
    """A headless Chromium with one blank page; killed (process group) on exit."""
    binary = chromium_path()
    if binary is None:
        raise RuntimeError("chromium is not installed (make test installs it)")
    process = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: renderers and helpers die with it
    )
    try:
        port = _devtools_port(profile, process, timeout)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.load(answer)
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        with connect(url, max_size=None, open_timeout=timeout) as socket:
            yield Page(socket)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
