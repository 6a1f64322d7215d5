"""Gradient-inversion attacks, found by name in :data:`ATTACKS`.

An attack sees only an :class:`~fedsim.attacks.base.Observation` (what the server
received and sent) and returns a :class:`~fedsim.attacks.base.Reconstruction`.
Ground truth never enters this package; scoring lives in :mod:`fedsim.core.metrics`.
"""

from __future__ import annotations

from typing import Any

from fedsim.core.registry import Registry

ATTACKS: Registry[Any] = Registry("attack", ("fedsim.attacks",))
