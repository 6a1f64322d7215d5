"""The parameters of fedsim's reconstruction attacks (:mod:`fedsim.attacks.reconstruction`),
by name: the optimising ones in :mod:`fedsim.core.params.optimising` and
:mod:`fedsim.core.params.matching`, the closed-form ones in :mod:`fedsim.core.params.analytic`
(imported on the first lookup)."""

from __future__ import annotations

from fedsim.core.params import Schemas

ATTACK_PARAMS = Schemas(
    "attack",
    group="fedsim.attacks",
    modules=(
        "fedsim.core.params.optimising",
        "fedsim.core.params.matching",
        "fedsim.core.params.analytic",
    ),
)
