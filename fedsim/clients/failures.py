"""The client's side of injected failures: a Flower mod that fails when the server says so.

The server marks the messages of the clients it picked to fail this round
(:mod:`fedsim.simulation.failures`); :func:`inject_failures` acts on the mark
before any client work, so a failing client changes no state:

- ``raise``: the client raises instead of training; Flower turns that into an
  error reply.
- ``timeout``: the client stays silent until the server's reply deadline has
  passed, then gives up.
"""

from __future__ import annotations

import time

from flwr.app import Context, Message
from flwr.clientapp.typing import ClientAppCallable

from fedsim.core import protocol

INJECTED_MARKER = "fedsim injected client failure"
# A straggler replies this long after the deadline: later than the server's last poll.
STRAGGLER_GRACE_S = 0.2


class InjectedFailure(RuntimeError):
    """Raised by a client the server marked to fail."""


def inject_failures(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower client mod: fail as the mark says, else run the handler."""
    failure = msg.content.config_records.get(protocol.FAILURE)
    if failure is None:
        return call_next(msg, context)
    if failure["kind"] == "timeout":
        deadline = protocol.read_float(failure, "deadline")
        time.sleep(max(0.0, deadline - time.time()) + STRAGGLER_GRACE_S)
    raise InjectedFailure(f"{INJECTED_MARKER} ({failure['kind']!s})")
