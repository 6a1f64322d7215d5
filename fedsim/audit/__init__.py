"""The honest-but-curious server's per-round privacy audit.

- :mod:`fedsim.audit.wrapper`: :class:`AuditedStrategy` wraps any Flower
  strategy, leaves its aggregate untouched and hands what the server received
  to the auditor.
- :mod:`fedsim.audit.observe`: builds an :class:`~fedsim.attacks.base.Observation`
  from exactly what the server sent and received.
- :mod:`fedsim.audit.tasks`: an attack on a batch of observations, as a Ray task
  inside the audit's reservation.
- :mod:`fedsim.audit.auditor`: chooses victims, submits tasks, scores what comes
  back against ground truth (:mod:`fedsim.core.truth`, out of band: it reaches
  only the scorer) and writes the records.
- :mod:`fedsim.audit.fidelity`: how well an attack's model of the client
  reproduces what the server saw.
- :mod:`fedsim.audit.experiment`: ``fedsim attack``, the same observe and score
  path on a gradient probe outside a federation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsim.audit.auditor import Auditor
    from fedsim.audit.observe import ServerView
    from fedsim.audit.wrapper import AuditedStrategy

__all__ = ["AuditedStrategy", "Auditor", "ServerView"]

# Imported on first use: the audit's Ray workers import fedsim.audit.tasks, which needs
# none of the scoring and records the auditor brings (2-3 s of imports per worker).
_EXPORTS = {
    "Auditor": "fedsim.audit.auditor",
    "ServerView": "fedsim.audit.observe",
    "AuditedStrategy": "fedsim.audit.wrapper",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
