"""The ``local`` baseline's client: trains alone, shares nothing.

Its whole network is private state (seeded per client); replies carry an
empty ``ArrayRecord`` and evaluation is on the client's local test split.
"""

from __future__ import annotations

from typing import ClassVar

from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.fedsplit import FedSplitClient


@CLIENT_ROUTINES.register("local")
class LocalClient(FedSplitClient):
    """FedSplit's client with nothing shared."""

    shared_prefixes: ClassVar[tuple[str, ...]] = ()
