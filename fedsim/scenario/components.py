"""A valid scenario resolved once: what the server, the clients and the audit receive.

:func:`fedsim.scenario.validate.validate` returns :class:`Components`. The
runner hands each part on narrowly: the strategy its class and frozen
``Params``, the clients a :class:`~fedsim.clients.base.ClientSpec` (their
model, data, seed and resolved defences), the audit its plan. The scenario
itself stays with what writes it down (``scenario.toml``, ``summary.md``,
checkpoints) and with validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedsim.clients.base import ClientSpec
from fedsim.clients.defences import resolve_defences
from fedsim.core.canaries import CanaryPlan
from fedsim.core.components import Resolved
from fedsim.core.config import Scenario
from fedsim.core.partition import resolve_generator, resolve_partitioner
from fedsim.scenario.portfolio import AuditPlan


@dataclass(frozen=True)
class Components:
    """A valid scenario's components, resolved: the strategy, the clients' spec and what
    the audit runs (empty without an audit), each class with its frozen parameters."""

    scenario: Scenario
    strategy: Resolved
    client: ClientSpec
    audit: AuditPlan = field(default_factory=AuditPlan)

    @property
    def attacks(self) -> tuple[Resolved, ...]:
        """The audit's reconstruction attacks on its threat model's observations."""
        return self.audit.attacks


def client_spec(
    scenario: Scenario, partitioner: Resolved | None = None, generator: Resolved | None = None
) -> ClientSpec:
    """What the clients of ``scenario`` read, its ``[[defences]]``, partitioner and generator
    resolved (``partitioner`` and ``generator``: already resolved by validation); a bad
    name or parameter raises :class:`~fedsim.core.config.ScenarioError`."""
    fed, data, audit = scenario.federation, scenario.data, scenario.audit
    canaries = audit.canaries if audit.enabled else 0
    return ClientSpec(
        model=scenario.model,
        data=data,
        num_clients=fed.num_clients,
        seed=fed.seed,
        use_gpu=scenario.backend.num_gpus > 0,
        defences=resolve_defences(scenario.defences),
        partitioner=partitioner or resolve_partitioner(data),
        generator=generator or resolve_generator(data),
        canaries=CanaryPlan(canaries, audit.canary_client, audit.seed),
        central_clipping=scenario.central_dp.clipping == "client",
        memorisation=scenario.memorisation,
    )
