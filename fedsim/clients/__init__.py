"""Client-side routines (local training per strategy), found by name.

The single Flower ``ClientApp`` in :mod:`fedsim.clients.app` dispatches every message
to the routine its strategy names; each routine is one module here.
"""

from __future__ import annotations

from typing import Any

from fedsim.clients.base import ClientRoutine
from fedsim.core.registry import Registry

CLIENT_ROUTINES: Registry[Any] = Registry(
    "client routine", ("fedsim.clients",), group="fedsim.clients", subclass_of=ClientRoutine
)
