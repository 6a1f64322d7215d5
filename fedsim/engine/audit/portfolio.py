"""``audit.attacks = "auto"``: every attack that applies, at a budget measured to converge.

An audit is only as strong as its strongest attack, so the default audit runs
a portfolio rather than one attack: each registered attack in
:data:`PORTFOLIO` order whose own
:meth:`~fedsim.attacks.base.Attack.check_scenario` accepts the scenario (the
shared parameters, threat model, client optimiser, FedCG's generator, ...),
with the step budget :func:`budget` gives for the model family. The budgets
are caps: every optimisation attack also stops early once it has converged
(:mod:`fedsim.attacks.convergence`). They come from
``bench/audit_budgets.py``: the steps after which the median PSNR over
unseen images stopped improving (the numbers are in ``docs/audit.md``).

An explicit list in ``audit.attacks`` is run as given.
"""

from __future__ import annotations

from typing import Any

from fedsim.attacks import ATTACKS
from fedsim.core.config import ComponentConfig, Scenario, ScenarioError, component_params

PORTFOLIO = (
    "analytic-fc",
    "inverting-gradients",
    "dlg",
    "sapag",
    "unrolled-dlg",
    "aligned-dlg",
    "grnn",
)
"""The portfolio, cheapest and strongest first (an attack not registered is skipped)."""

# Step caps and restarts per attack for LeNet-sized models (every zoo model but
# ResNet-18) and for ResNet-18, from bench/audit_budgets.py (docs/audit.md).
_BUDGETS: dict[str, dict[str, dict[str, Any]]] = {
    "small": {
        "inverting-gradients": {"steps": 1000, "restarts": 2},
        "dlg": {"steps": 100, "restarts": 2},
        "sapag": {"steps": 100, "restarts": 2},
        "unrolled-dlg": {"steps": 100, "restarts": 2},
        "aligned-dlg": {"steps": 100, "restarts": 2},
        "grnn": {"steps": 1000, "restarts": 1},
    },
    "resnet": {
        "inverting-gradients": {"steps": 1000, "restarts": 1},
        "dlg": {"steps": 50, "restarts": 1},
        "sapag": {"steps": 50, "restarts": 1},
        "unrolled-dlg": {"steps": 50, "restarts": 1},
        "aligned-dlg": {"steps": 50, "restarts": 1},
        "grnn": {"steps": 500, "restarts": 1},
    },
}


def replays_updates(scenario: Scenario) -> bool:
    """Whether the server can replay the clients' local training (plain SGD, updates)."""
    cfg = scenario.client
    return (
        scenario.audit.threat_model == "update"
        and cfg.optimizer == "sgd"
        and not cfg.momentum
        and not cfg.weight_decay
    )


def budget(name: str, scenario: Scenario) -> dict[str, Any]:
    """The portfolio's parameters for attack ``name`` in ``scenario``."""
    family = "resnet" if scenario.model.name.startswith("resnet") else "small"
    params = dict(_BUDGETS[family].get(name, {}))
    if name == "inverting-gradients":
        # IG replays several local steps only for plain SGD; otherwise it reads an
        # update as one large-batch gradient (as DLG does).
        params["unroll"] = replays_updates(scenario)
    return params


def resolve_attacks(
    scenario: Scenario, uploads: tuple[str, ...] | None
) -> tuple[ComponentConfig, ...]:
    """The attacks the audit runs: the scenario's list, or for ``"auto"`` the portfolio's.

    ``uploads``: the parameter-name prefixes the strategy's clients upload
    (``None``: the whole model).
    """
    attacks = scenario.audit.attacks
    if not isinstance(attacks, str):
        return attacks
    chosen = []
    for name in PORTFOLIO:
        if name not in ATTACKS.names():
            continue
        attack = ComponentConfig(name, budget(name, scenario))
        attack_cls = ATTACKS.get(name)
        key = f"audit.attacks (auto: {name})"
        component_params(attack_cls, attack, key)  # the budgets are valid parameters
        try:
            attack_cls.check_scenario(scenario, uploads, key)
        except ScenarioError:
            continue  # does not apply here
        chosen.append(attack)
    return tuple(chosen)
