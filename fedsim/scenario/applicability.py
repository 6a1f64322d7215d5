"""Which of a scenario's choices fit together: every pair decided here, before any work.

Each component declares what it offers or needs (a strategy: what its clients upload
and whether the server reads only their mean; an attack or leak analysis: the threat
models it reads, :attr:`~fedsim.attacks.base.Attack.threat_models`, and in its
``check_setting`` the uploads, data and model it needs; a defence: whether it acts only
on a probe); the rules pairing them live here, so a plugin joins by declaring, never by
being named. A pair that cannot work is refused in one line naming both choices and
what would work instead; ``"auto"`` leaves out what does not apply, and the run's
summary says what it left out and which valid settings are degenerate
(:func:`audit_notes`).

The pairs: strategy x threat model (:func:`check_strategy_threat`), threat model x
attack or analysis and strategy or dataset (its modality too) x analysis
(:func:`check_applies`), defence
x threat model (:func:`check_defence_threat`), and the threat model against central DP's
clipping and the one-run canaries (:func:`check_threat_options`).
"""

from __future__ import annotations

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import Attack, AttackSetting
from fedsim.attacks.leakage import LEAKS, LeakAnalysis
from fedsim.core.components import Resolved
from fedsim.core.config import (
    AUTO,
    AuditConfig,
    CentralDPConfig,
    FederationConfig,
    ScenarioError,
    require,
)
from fedsim.core.modality import IMAGE
from fedsim.core.threat import ThreatModel, refusal
from fedsim.scenario.modality import check_fits
from fedsim.strategies import STRATEGIES
from fedsim.strategies.base import EngineHooks

Analysis = Attack | LeakAnalysis
"""What reads the server's observations: a reconstruction attack or a leak analysis."""


def shares_nothing(uploads: tuple[str, ...] | None) -> bool:
    """Whether a strategy whose clients upload ``uploads`` (its ``shared_prefixes``;
    ``None``: the whole model) shares nothing (``local``): nothing to audit."""
    return uploads == ()


def _able(wanted: str) -> str:
    """The registered strategies with the declared capability ``wanted``, listed."""
    return ", ".join(n for n in STRATEGIES.names() if getattr(STRATEGIES.get(n), wanted))


def _sharing() -> str:
    names = STRATEGIES.names()
    return ", ".join(n for n in names if not shares_nothing(STRATEGIES.get(n).shared_prefixes))


def check_strategy_threat(
    audit: AuditConfig, fed: FederationConfig, strategy: str, strategy_cls: type[EngineHooks]
) -> None:
    """Strategy x threat model (and what an audit of a strategy that shares nothing lists).

    A strategy sharing nothing runs under any threat model with nothing to audit, but a
    listed attack or analysis is refused; a threat model hiding replies needs a strategy
    whose server reads only their weighted mean, over every reply (no stragglers)."""
    if not audit.enabled:
        return
    if shares_nothing(strategy_cls.shared_prefixes):
        for key, listed in (("audit.attacks", audit.attacks), ("audit.leaks", audit.leaks)):
            if listed == AUTO or not listed:
                continue
            raise ScenarioError(
                f"{key}[0].name",
                listed[0].name,
                f"strategy {strategy!r} shares nothing with the server, so there is nothing "
                f'to attack; leave {key} "auto" (the audit then says there is nothing to audit) '
                f"or use a strategy that shares parameters: {_sharing()}",
            )
        return
    threat = audit.threat_model
    if not threat.hides_replies:
        return
    require(
        strategy_cls.weighted_mean,
        "audit.threat-model",
        threat,
        f"strategy {strategy!r} reads replies one by one, which secure aggregation hides; "
        f"these read only their weighted mean: {_able('weighted_mean')}; or use "
        f"threat-model = {ThreatModel.UPDATE!r}",
    )
    require(
        fed.stragglers == 0,
        "audit.threat-model",
        threat,
        "the strategy leaves stragglers out of its mean: set federation.stragglers = 0",
    )


def check_threat_options(audit: AuditConfig, central: CentralDPConfig) -> None:
    """The threat model against central DP's clipping and the one-run canaries, which
    both read single replies."""
    if not (audit.enabled and audit.threat_model.hides_replies):
        return
    require(
        not central.enabled or central.clipping == "client",
        "central-dp.clipping",
        central.clipping,
        "server-side clipping reads each reply, which secure aggregation (audit.threat-model "
        f'= {audit.threat_model!r}) hides; use clipping = "client"',
    )
    require(
        not audit.canaries,
        "audit.canaries",
        audit.canaries,
        "audit one client's records (its membership scores); under audit.threat-model = "
        f"{audit.threat_model!r} no client's own update is seen: set canaries = 0 or "
        f"threat-model = {ThreatModel.UPDATE!r}",
    )


def check_defence_threat(defences: tuple[Resolved, ...], threat: ThreatModel | None) -> None:
    """Defence x threat model (``None``: no audit): one acting only on a probed gradient
    (Soteria, as its paper evaluates it) needs the audit's probe."""
    for defence in defences:
        require(
            not defence.cls.probe_only or threat == ThreatModel.PROBE,
            defence.key,
            defence.name,
            f"{defence.name} perturbs one shared gradient, as its paper evaluates it: it needs "
            f'[audit] with threat-model = "{ThreatModel.PROBE}" (got '
            f"{'no audit' if threat is None else repr(threat)})",
        )


def check_applies(cls: type[Analysis], name: str, setting: AttackSetting, key: str) -> None:
    """Attack or leak analysis ``cls`` (registered as ``name``) x the dataset's modality and
    x the threat model (both declared: ``modality``, ``threat_models``), then x the
    strategy's uploads, the dataset and the model (its own ``check_setting``)."""
    registry = LEAKS if issubclass(cls, LeakAnalysis) else ATTACKS
    check_fits(registry, cls, key, name, setting.data, IMAGE)
    why = refusal(cls.threat_models, setting.threat_model)
    if why is not None:
        raise ScenarioError(f"{key}.name", name, why)
    cls.check_setting(setting, key)


def audit_notes(
    audit: AuditConfig, fed: FederationConfig, strategy: str, strategy_cls: type[EngineHooks]
) -> tuple[str, ...]:
    """What the run's summary says of valid but degenerate audit settings."""
    if not audit.enabled:
        return ()
    if shares_nothing(strategy_cls.shared_prefixes):
        return (f"strategy {strategy!r} shares nothing with the server: nothing to audit",)
    if audit.threat_model.hides_replies and fed.sampled_per_round == 1:
        return (
            f"threat model {audit.threat_model!r} over one client a round is that client's "
            f"update: it adds nothing to {ThreatModel.UPDATE!r} here",
        )
    return ()


def left_out(kind: str, name: str, err: ScenarioError) -> str:
    """The summary's line for an ``"auto"`` component left out, with its reason."""
    return f'{kind} = "auto" left out {name}: {err.allowed}'
