"""``audit.attacks = "auto"``: every attack that applies, at a budget measured to converge.

An audit is only as strong as its strongest attack, so the default audit runs
a portfolio rather than one attack: each registered attack in
:data:`PORTFOLIO` order whose own
:meth:`~fedsim.attacks.base.Attack.check_setting` accepts the scenario (the
shared parameters, threat model, client optimiser, FedCG's generator, ...),
with the step budget :func:`budget` gives for the model family. The budgets
are caps: every optimisation attack also stops early once it has converged
(:mod:`fedsim.attacks.convergence`). They come from
``bench/audit_budgets.py``: the steps after which the median PSNR over
unseen images stopped improving, or the largest budget measured where it
had not (the numbers are in ``docs/audit.md``).

An explicit list in ``audit.attacks`` is run as given, each attack checked.
"""

from __future__ import annotations

from typing import Any

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import AttackSetting
from fedsim.attacks.replay import replay_refusal
from fedsim.core.components import Resolved, resolve
from fedsim.core.config import ComponentConfig, Scenario, ScenarioError

PORTFOLIO = (
    "analytic-fc",
    "spear",
    "rgap",
    "inverting-gradients",
    "dlg",
    "sapag",
    "fedavg-leakage",
    "unrolled-dlg",
    "aligned-dlg",
    "grnn",
)
"""The portfolio, cheapest and strongest first (an attack not registered is skipped)."""

# Step caps per model, from bench/audit_budgets.py at batch 1 (probe, 4 unseen images,
# early stopping on; docs/audit.md has the table): the knee (the smallest budget within
# 0.5 dB of the best) where an attack converged, else the largest budget measured, at
# which it was still improving (its rows are then flagged as not converged).
_MEASURED: dict[str, dict[str, int]] = {
    "lenet5-split": {"inverting-gradients": 250, "dlg": 10, "sapag": 100, "grnn": 1000},
    "lenet-zhu": {"inverting-gradients": 2000, "dlg": 100, "sapag": 25, "grnn": 1000},
}
# fedavg-leakage replays every local step per objective evaluation: its budget, whatever the
# model, is the smallest at which tests/test_fedavg_leakage.py saw an image of a 2-epoch SGD
# client recovered at 20 dB (60 L-BFGS steps x 4 restarts; 40 x 2 recovered none there).
_REPLAYED = {"fedavg-leakage": {"steps": 60, "restarts": 4}}
_UNMEASURED = {"inverting-gradients": 2000, "dlg": 100, "sapag": 100, "grnn": 1000}
_RESNET = {"inverting-gradients": 1000, "dlg": 50, "sapag": 50, "grnn": 500}
_RESTARTS = {"grnn": 1}  # the others: 2 (restarts are batched; GRNN's run one after another)
_LIKE_DLG = ("unrolled-dlg", "aligned-dlg")  # DLG's optimiser and objective scale

RECONSTRUCTION_REACH = 5
"""The largest client (in images) from whose update an image was recovered at 20 dB: 3 of 10
Fashion-MNIST images at 5 per client; none at 10 (bench/fedavg_leakage.py,
docs/attacks.md#reach-on-real-multi-step-updates)."""


def reconstruction_refusal(images: int) -> str | None:
    """One line refusing reconstruction from an update on ``images`` images beyond the reach."""
    if images <= RECONSTRUCTION_REACH:
        return None
    return (
        f"trained on {images} images: beyond the measured reach of reconstruction from updates "
        f"({RECONSTRUCTION_REACH} images, docs/attacks.md#reach-on-real-multi-step-updates)"
    )


def replays_updates(scenario: Scenario) -> bool:
    """Whether the server can replay the clients' local training (updates, a known optimiser
    state: :func:`fedsim.attacks.replay.replay_refusal`)."""
    return scenario.audit.threat_model == "update" and replay_refusal(scenario.client) is None


def budget(name: str, scenario: Scenario) -> dict[str, Any]:
    """The portfolio's parameters for attack ``name`` in ``scenario``."""
    model = scenario.model.name
    caps = _RESNET if model.startswith("resnet") else _MEASURED.get(model, _UNMEASURED)
    if name in _REPLAYED:
        return dict(_REPLAYED[name])
    optimised = "dlg" if name in _LIKE_DLG else name
    if optimised not in caps:
        return {}  # a closed-form attack: nothing to budget
    params: dict[str, Any] = {"steps": caps[optimised], "restarts": _RESTARTS.get(name, 2)}
    if name == "inverting-gradients":
        # IG replays several local steps where the server can; otherwise it reads an
        # update as one large-batch gradient (as DLG does).
        params["unroll"] = replays_updates(scenario)
    return params


def resolve_attacks(scenario: Scenario, uploads: tuple[str, ...] | None) -> tuple[Resolved, ...]:
    """The attacks the audit runs, resolved: the scenario's list (each checked, a bad one
    raises), or for ``"auto"`` the portfolio's that apply (possibly none).

    ``uploads``: the parameter-name prefixes the strategy's clients upload
    (``None``: the whole model).
    """
    attacks = scenario.audit.attacks
    if not isinstance(attacks, str):
        return tuple(
            check_attack(attack, f"audit.attacks[{i}]", scenario, uploads)
            for i, attack in enumerate(attacks)
        )
    setting = AttackSetting.of(scenario, uploads)
    chosen = []
    for name in PORTFOLIO:
        if name not in ATTACKS.names():
            continue
        key = f"audit.attacks (auto: {name})"
        attack = resolve(ATTACKS, ComponentConfig(name, budget(name, scenario)), key)
        try:
            attack.cls.check_setting(setting, key)
        except ScenarioError:
            continue  # does not apply here
        chosen.append(attack)
    return tuple(chosen)


def check_attack(
    attack: ComponentConfig, key: str, scenario: Scenario, uploads: tuple[str, ...] | None
) -> Resolved:
    """The attack is registered, its parameters are valid, and the server sees what it needs."""
    resolved = resolve(ATTACKS, attack, key)
    resolved.cls.check_setting(AttackSetting.of(scenario, uploads), key)
    return resolved
