"""What ``audit.attacks = "auto"`` runs an optimisation attack with: its step caps per model.

An attack declares its :class:`StepCaps` on the class (subclasses inherit them); the
portfolio (:mod:`fedsim.scenario.portfolio`) keeps only the order. The caps come from
``bench/audit_budgets.py`` at batch 1 (probe, 4 unseen images, early stopping on;
docs/audit.md has the table): the knee (the smallest budget within 0.5 dB of the best)
where an attack converged, else the largest budget measured, at which it was still
improving. Every optimisation attack also stops early once it has converged
(:mod:`fedsim.attacks.toolkits.convergence`), so the caps are caps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class StepCaps:
    """Step caps by model: ``measured`` per model name, else ``resnet`` for the ResNets,
    else ``unmeasured``; ``restarts`` run batched (GRNN's one after another)."""

    unmeasured: int
    resnet: int
    measured: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    restarts: int = 2

    def params(self, model: str) -> dict[str, Any]:
        """The audit's ``steps`` and ``restarts`` for a model named ``model``."""
        if model.startswith("resnet"):
            steps = self.resnet
        else:
            steps = self.measured.get(model, self.unmeasured)
        return {"steps": steps, "restarts": self.restarts}
