"""The threat model: what the honest-but-curious server observes of a round, as one type.

``audit.threat-model`` names one :class:`ThreatModel`; everything that depends on it
asks the type, never compares its name:

- what the server observes (:attr:`ThreatModel.observes`) and the kind of tensor it holds
  (:attr:`ThreatModel.shared_kind`: a probe's gradient, else an update);
- whether that is one client's upload or the round's example-weighted mean, which hides
  every single reply (:attr:`ThreatModel.hides_replies`: secure aggregation);
- whether the server really receives it (:attr:`ThreatModel.counterfactual`: a probe is
  computed by the harness, never sent);
- which threat models an attack or leak analysis reads (its declared
  ``threat_models``; :func:`refusal` is the one line refusing the others).

Which strategies, attacks, analyses, datasets and defences fit together under it is
decided in one place, :mod:`fedsim.scenario.applicability`. This module imports
nothing heavy: the configuration parses ``audit.threat-model`` into it before torch.
"""

from __future__ import annotations

from enum import StrEnum


class SharedKind(StrEnum):
    """Whether an observation's tensors are gradients or updated parameters (signs differ)."""

    GRADIENT = "gradient"
    UPDATE = "update"

    def __repr__(self) -> str:
        return repr(self.value)


class ThreatModel(StrEnum):
    """What the server observes of a round (``audit.threat-model``)."""

    UPDATE = "update"
    """Each client's reply as the server receives it."""
    PROBE = "probe"
    """One batch's gradient at the sent model: the papers' probe, which a server running
    the strategy never receives (a counterfactual, computed by the harness)."""
    AGGREGATE = "aggregate"
    """Only the example-weighted mean of the round's replies: what a server behind secure
    aggregation learns."""

    def __repr__(self) -> str:  # refusal lines quote the name as a scenario writes it
        return repr(self.value)

    @property
    def observes(self) -> str:
        """What the server holds under this threat model, for people."""
        return {
            ThreatModel.UPDATE: "one client's update",
            ThreatModel.PROBE: "one batch's gradient at the sent model",
            ThreatModel.AGGREGATE: "the example-weighted mean of the round's updates",
        }[self]

    @property
    def shared_kind(self) -> SharedKind:
        """What its observations hold: a probe's gradient, else updated parameters."""
        return SharedKind.GRADIENT if self is ThreatModel.PROBE else SharedKind.UPDATE

    @property
    def hides_replies(self) -> bool:
        """Whether single replies are hidden from the server (only their mean is seen)."""
        return self is ThreatModel.AGGREGATE

    @property
    def counterfactual(self) -> bool:
        """Whether the server never receives it: the harness computes it from the
        client's data (a probe), so the audit needs the clients' truth source."""
        return self is ThreatModel.PROBE

    @property
    def one_client(self) -> bool:
        """Whether each observation is one client's (an update or a probe)."""
        return not self.hides_replies


ALL_THREAT_MODELS = frozenset(ThreatModel)
"""Every threat model: what an attack or analysis reads unless it declares less."""

UPDATES = frozenset({ThreatModel.UPDATE, ThreatModel.AGGREGATE})
"""The threat models whose observation is a model update (one client's, or the mean)."""

ONE_UPDATE = frozenset({ThreatModel.UPDATE})
"""One client's own update, as it arrives (replaying it, Adam's signs, its generator)."""

ONE_CLIENT = frozenset(t for t in ThreatModel if t.one_client)
"""One client's own upload, an update or a probe's gradient (not the round's mean)."""


def refusal(reads: frozenset[ThreatModel], threat: ThreatModel) -> str | None:
    """One line refusing a component that reads the threat models ``reads`` under
    ``threat``, saying what would work instead; ``None`` where it applies."""
    if threat in reads:
        return None
    works = " or ".join(f"{m.observes} (threat-model = {m!r})" for m in ThreatModel if m in reads)
    return f"reads {works}; audit.threat-model = {threat!r} gives {threat.observes}"
