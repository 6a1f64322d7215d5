"""``audit.attacks = "auto"``: every attack that applies, at a budget measured to converge.

An audit is only as strong as its strongest attack, so the default audit runs
a portfolio rather than one attack: each registered attack in
:data:`PORTFOLIO` order whose own
:meth:`~fedsim.attacks.base.Attack.check_setting` accepts the scenario (the
shared parameters, threat model, client optimiser, FedCG's generator, ...),
with the step budget :func:`budget` gives for the model family. The budgets
are caps: every optimisation attack also stops early once it has converged
(:mod:`fedsim.attacks.toolkits.convergence`). They come from
``bench/audit_budgets.py``: the steps after which the median PSNR over
unseen images stopped improving, or the largest budget measured where it
had not (the numbers are in ``docs/audit.md``).

An explicit list in ``audit.attacks`` is run as given, each attack checked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import AttackSetting
from fedsim.attacks.leakage import LEAKS
from fedsim.core.components import Resolved, resolve
from fedsim.core.config import (
    AUTO,
    RECONSTRUCTION_REACH,
    AuditConfig,
    ComponentConfig,
    FederationConfig,
    ScenarioError,
    require,
)
from fedsim.core.modality import IMAGE
from fedsim.core.registry import Registry
from fedsim.core.threat import ThreatModel
from fedsim.scenario.applicability import check_applies, left_out, shares_nothing
from fedsim.scenario.modality import fits

PORTFOLIO = (
    "dager",
    "analytic-fc",
    "adam-signs",
    "spear",
    "box-vertices",
    "cocktail-party",
    "rgap",
    "inverting-gradients",
    "dlg",
    "sapag",
    "fedavg-leakage",
    "unrolled-dlg",
    "aligned-dlg",
    "grnn",
    "tag",
)
"""The portfolio, cheapest and strongest first (an attack not registered is skipped; one
made for another modality than the data's is never considered: ``dager`` and ``tag`` run on
text only, the others on images only); each attack's budget is its own
:meth:`~fedsim.attacks.base.Attack.audit_preset`. A variant that declares ``in_auto`` joins
after its family (:attr:`~fedsim.attacks.base.Attack.variant_of`): the defence-aware
attacks after ``inverting-gradients`` and ``dlg``."""


def reconstruction_refusal(images: int) -> str | None:
    """One line refusing reconstruction from an update on ``images`` images beyond the reach."""
    if images <= RECONSTRUCTION_REACH:
        return None
    return (
        f"trained on {images} images: beyond the measured reach of reconstruction from updates "
        f"({RECONSTRUCTION_REACH} images, docs/attacks.md#reach-on-real-multi-step-updates)"
    )


def budget(name: str, setting: AttackSetting) -> dict[str, Any]:
    """The portfolio's parameters for attack ``name`` in ``setting``: its own preset."""
    preset: dict[str, Any] = ATTACKS.get(name).audit_preset(setting)
    return preset


def auto_attacks() -> list[str]:
    """What ``"auto"`` may run: the portfolio's registered attacks in its order, each
    ``in_auto`` variant right after its family's first, then the plugins' ``in_auto`` attacks."""
    names = ATTACKS.names()
    order = [name for name in PORTFOLIO if name in names]
    for name in [n for n in names if n not in order and ATTACKS.get(n).in_auto]:
        family = ATTACKS.get(name).variant_of
        members = [i for i, n in enumerate(order) if family and issubclass(ATTACKS.get(n), family)]
        order.insert(members[0] + 1 if members else len(order), name)
    return order


@dataclass(frozen=True)
class AuditPlan:
    """What the audit runs, resolved: the reconstruction attacks on the threat model's
    observations, the other leak analyses, and the attacks on the counterfactual probe
    of ``audit.probe-rounds`` (empty when there are none, or the threat model is the probe)."""

    attacks: tuple[Resolved, ...] = ()
    leaks: tuple[Resolved, ...] = ()
    probe_attacks: tuple[Resolved, ...] = ()
    # For the run's summary: what "auto" left out and why, and degenerate settings
    # (:func:`fedsim.scenario.applicability.audit_notes`).
    notes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Whether it runs no attack and no leak analysis in any round."""
        return not (self.attacks or self.leaks or self.probe_attacks)

    @property
    def every_attack(self) -> tuple[Resolved, ...]:
        """The reconstruction attacks of every round, the probe's included."""
        return (*self.attacks, *self.probe_attacks)


def resolve_audit(
    audit: AuditConfig, setting: AttackSetting, notes: list[str] | None = None
) -> AuditPlan:
    """``audit`` in ``setting``, resolved (:func:`resolve_attacks`, :func:`resolve_leaks`);
    what ``"auto"`` leaves out is added to ``notes``.

    With ``probe-rounds`` in an ``update`` audit, a listed attack runs under each threat
    model it applies to (``analytic-fc`` on the probe only, say) and is refused only
    where it applies to neither."""
    leaks = resolve_leaks(audit, setting, notes)
    if not audit.probe_rounds or audit.threat_model == ThreatModel.PROBE:
        return AuditPlan(resolve_attacks(audit, setting, notes), leaks)
    probed = dataclasses.replace(setting, threat_model=ThreatModel.PROBE)
    if audit.attacks == AUTO:
        # The probe's portfolio is a counterfactual beside the audit: its left-outs unsaid.
        attacks = resolve_attacks(audit, setting, notes)
        return AuditPlan(attacks, leaks, resolve_attacks(audit, probed))
    settings = (setting, probed)
    runs: tuple[list[Resolved], list[Resolved]] = ([], [])
    for i, attack in enumerate(audit.attacks):
        key = f"audit.attacks[{i}]"
        resolved = resolve(ATTACKS, attack, key)
        refusals = []
        for setting, chosen in zip(settings, runs, strict=True):
            try:
                check_applies(resolved.cls, resolved.name, setting, key)
                chosen.append(resolved)
            except ScenarioError as err:
                refusals.append(err)
        if len(refusals) == len(settings):
            raise refusals[0]
    return AuditPlan(tuple(runs[0]), leaks, tuple(runs[1]))


def resolve_attacks(
    audit: AuditConfig, setting: AttackSetting, notes: list[str] | None = None
) -> tuple[Resolved, ...]:
    """The attacks ``audit`` runs in ``setting``, resolved: its list (each checked, a bad
    one raises), or for ``"auto"`` the portfolio's that apply (possibly none; those left
    out are added to ``notes``).

    The threat model is ``setting``'s (``audit.threat-model``, or the probe of
    ``audit.probe-rounds``).
    """
    attacks = audit.attacks
    if attacks != AUTO:
        return tuple(
            _checked(ATTACKS, attack, f"audit.attacks[{i}]", setting)
            for i, attack in enumerate(attacks)
        )
    budgets = {name: budget(name, setting) for name in auto_attacks()}
    return _applying(ATTACKS, "audit.attacks", budgets, setting, notes)


def resolve_leaks(
    audit: AuditConfig, setting: AttackSetting, notes: list[str] | None = None
) -> tuple[Resolved, ...]:
    """The leak analyses ``audit`` runs in ``setting``, resolved: its list (each checked),
    or for ``"auto"`` every registered analysis that applies, at its defaults (those left
    out are added to ``notes``)."""
    leaks = audit.leaks
    if leaks != AUTO:
        return tuple(
            _checked(LEAKS, leak, f"audit.leaks[{i}]", setting) for i, leak in enumerate(leaks)
        )
    names = [name for name in LEAKS.names() if LEAKS.get(name).in_auto]
    chosen = _applying(LEAKS, "audit.leaks", {name: {} for name in names}, setting, notes)
    successor = {old: one.name for one in chosen for old in one.cls.supersedes}
    if notes is not None:
        notes.extend(
            f'audit.leaks = "auto" left out {one.name}: {successor[one.name]} reads the same '
            "kind here, better and cheaper (docs/leaks.md)"
            for one in chosen
            if one.name in successor
        )
    return tuple(one for one in chosen if one.name not in successor)


def _applying(
    registry: Registry[Any],
    key: str,
    params: dict[str, dict[str, Any]],
    setting: AttackSetting,
    notes: list[str] | None,
) -> tuple[Resolved, ...]:
    """Each name of ``params`` resolved with its parameters, keeping those that apply
    (:func:`~fedsim.scenario.applicability.check_applies`); the others go to ``notes``."""
    chosen = []
    for name, table in params.items():
        where = f"{key} (auto: {name})"
        if not fits(registry.get(name), setting.data, IMAGE):
            continue  # made for another modality
        component = resolve(registry, ComponentConfig(name, table), where)
        try:
            check_applies(component.cls, name, setting, where)
        except ScenarioError as err:
            if notes is not None:
                notes.append(left_out(key, name, err))
            continue  # does not apply here
        chosen.append(component)
    return tuple(chosen)


def _checked(
    registry: Registry[Any], component: ComponentConfig, key: str, setting: AttackSetting
) -> Resolved:
    """The component is registered, its parameters are valid, and the server sees what it needs."""
    resolved = resolve(registry, component, key)
    check_applies(resolved.cls, resolved.name, setting, key)
    return resolved


def check_audit(
    audit: AuditConfig, fed: FederationConfig, setting: AttackSetting, notes: tuple[str, ...] = ()
) -> AuditPlan:
    """Audit victims and rounds lie inside the federation ``fed``; every attack and leak
    analysis can see its target in ``setting``. Returns them, resolved, with ``notes`` and
    what ``"auto"`` left out for the summary (nothing at all where nothing is shared)."""
    for victim in audit.victim_ids:
        require(
            0 <= victim < fed.num_clients,
            "audit.victim-ids",
            list(audit.victim_ids),
            f"partition ids are 0 to {fed.num_clients - 1} (federation.num-clients)",
        )
    for key, rounds in (("audit.rounds", audit.rounds), ("audit.probe-rounds", audit.probe_rounds)):
        late = [r for r in rounds if r > fed.rounds]
        require(
            not late,
            key,
            list(rounds),
            f"rounds are 1 to {fed.rounds} (federation.rounds); {late} would audit nothing",
        )
    if shares_nothing(setting.uploads):
        return AuditPlan(notes=notes)
    left: list[str] = []
    plan = dataclasses.replace(resolve_audit(audit, setting, left), notes=(*notes, *left))
    require(
        bool(plan.attacks or plan.leaks or audit.canary_clients),
        "audit.attacks",
        audit.attacks,
        "no attack or leak analysis to run: none applies to this scenario, or none is "
        "listed; list attacks by hand",
    )
    if audit.canaries:
        require(
            audit.canary_client < fed.num_clients,
            "audit.canary-client",
            audit.canary_client,
            f"partition ids are 0 to {fed.num_clients - 1} (federation.num-clients)",
        )
        require(
            any(a.cls.kind == "membership" for a in plan.leaks),
            "audit.canaries",
            audit.canaries,
            "are scored by a membership analysis, and audit.leaks runs none here "
            "(list loss-drop; it needs the whole model's update and a held-out split)",
        )
    return plan
