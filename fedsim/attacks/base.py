"""The one door between a simulation and an attack.

An :class:`Observation` holds exactly what an honest-but-curious server has:
the round, the victim's upload (only the parameters the strategy shares), the
global parameters it sent, the public training config, the architecture and
the public data pipeline, plus the tensors beyond the model's parameters that
were uploaded (FedCG's generator, BatchNorm buffers) or sent. It has no field
for images or labels, so an attack cannot reach ground truth through it; the
one deliberate exception, ``batch_statistics``, is granted only to an attack
whose premise is knowing them (``batchnorm = "known"``) and is recorded so.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from fedsim.attacks.presets import StepCaps
from fedsim.core.config import (
    ClientConfig,
    ComponentConfig,
    DataConfig,
    ModelConfig,
    Scenario,
)
from fedsim.core.data import Normalization, generated_dataset, load_raw
from fedsim.core.models import InputSpec
from fedsim.core.threat import ALL_THREAT_MODELS, SharedKind, ThreatModel

AGGREGATE_CLIENT = -1
"""The ``client_id`` of an observation under a threat model that hides replies
(:attr:`~fedsim.core.threat.ThreatModel.hides_replies`): it is no one client's upload."""


@dataclass(frozen=True)
class AttackSetting:
    """What decides, before a run, whether an attack applies: all of it public.

    The architecture, the input pipeline's shape, the clients' training config,
    the strategy and the parameter-name prefixes its clients upload (``None``:
    the whole model), and what the audit intercepts (``audited`` is false for
    ``fedsim attack``, which checks each probe as it comes).
    """

    model: ModelConfig
    client: ClientConfig
    data: DataConfig
    strategy: str
    uploads: tuple[str, ...] | None
    audited: bool = True
    threat_model: ThreatModel = ThreatModel.UPDATE
    probe_batch_size: int = 1
    # The dataset has a held-out split no client trains on (the server's public data
    # and the membership candidates' non-members); a generated dataset has none, nor one
    # whose test split is its training set (foolbox's samples, lfw-faces).
    held_out: bool = True
    # The clients' defences, as the scenario lists them: public (Kerckhoffs), read by the
    # defence-aware attacks (:mod:`fedsim.attacks.reconstruction.defence_aware`).
    defences: tuple[ComponentConfig, ...] = ()
    # Clients sampled per round (``None``: not known), for analyses that read a client
    # against the round's others (``fedmia``).
    clients_per_round: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "threat_model", ThreatModel(self.threat_model))

    @classmethod
    def of(cls, scenario: Scenario, uploads: tuple[str, ...] | None) -> AttackSetting:
        """The setting of ``scenario``, whose strategy's clients upload ``uploads``."""
        audit = scenario.audit
        return cls(
            scenario.model,
            scenario.client,
            scenario.data,
            scenario.strategy.name,
            uploads,
            audit.enabled,
            audit.threat_model,
            audit.probe_batch_size,
            generated_dataset(scenario.data) is None and load_raw(scenario.data).held_out,
            tuple(scenario.defences),
            scenario.federation.sampled_per_round,
        )


@dataclass(frozen=True)
class PublicData:
    """Labelled examples the server holds and no client ever trains on.

    The public half of the dataset's held-out split (the other half gives the
    membership candidates' non-members): images in model-input space (the
    public normalisation applied), labels ``(N,)`` long. What an attack may use
    to calibrate (shadow updates, a label method's impact, a reconstruction
    prior, ...).
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class Observation:
    """What the server intercepted from one client in one round."""

    round: int
    client_id: int
    threat_model: ThreatModel
    shared_kind: SharedKind
    shared: dict[str, torch.Tensor]
    global_params: dict[str, torch.Tensor]
    model: ModelConfig
    input_spec: InputSpec
    normalization: Normalization
    train_config: ClientConfig
    num_examples: int
    strategy: str = "fedavg"
    proximal_mu: float = 0.0  # FedProx's mu, sent with the round's config
    extra_uploads: dict[str, torch.Tensor] = field(default_factory=dict)
    extra_sent: dict[str, torch.Tensor] = field(default_factory=dict)
    batch_statistics: dict[str, torch.Tensor] | None = None  # the "known" attacker's premise
    # An aggregate's examples per summed client (public: each reply's reported size and
    # the round's config); empty for one client's upload, whose size is ``num_examples``.
    summed_examples: tuple[int, ...] = ()
    # The server's public data, granted only to an attack that declares it reads them
    # (:attr:`Attack.reads_public`: a prior fitted on them), never client data.
    public: PublicData | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "threat_model", ThreatModel(self.threat_model))
        object.__setattr__(self, "shared_kind", SharedKind(self.shared_kind))

    @property
    def source(self) -> str:
        """Whose upload this is, for people: ``client 3``, or ``aggregate of 5 clients``."""
        if self.summed_examples:
            return f"aggregate of {len(self.summed_examples)} clients"
        return f"client {self.client_id}"

    @property
    def is_update(self) -> bool:
        """Whether ``shared`` holds updated parameters (a reply), not gradients (a probe)."""
        return self.shared_kind == SharedKind.UPDATE

    @property
    def shared_names(self) -> list[str]:
        """Parameter names the victim uploaded (the attack's target layers)."""
        return list(self.shared)


@dataclass(frozen=True)
class Reconstruction:
    """An attack's output: images in pixel space [0, 1] and labels.

    ``iterations`` is the step budget, ``steps_taken`` the steps run (fewer when
    the attack stopped early), ``converged`` whether the kept restart met its
    attack's convergence rule (:mod:`fedsim.attacks.toolkits.convergence`; an exact,
    closed-form attack has converged by construction). A result that has not
    converged is a lower bound of what the attack could recover.
    """

    images: torch.Tensor
    labels: torch.Tensor
    objective_trace: list[float]
    iterations: int
    restarts: int = 1
    final_objective: float = float("nan")
    seconds: float = 0.0
    steps_taken: int = 0
    converged: bool = False
    details: dict[str, Any] = field(default_factory=dict)


# Progress of a running attack: (step, steps in all, lowest objective at this step).
ProgressFn = Callable[[int, int, float], None]
PROGRESS_REPORTS = 20  # reports per optimisation: each costs one device-to-host copy


class Attack(ABC):
    """An attack: a frozen ``Params`` dataclass plus :meth:`reconstruct`.

    Set :attr:`progress` to follow a running attack: the optimisation loops
    call :meth:`report_progress` every step, which calls it about
    :data:`PROGRESS_REPORTS` times per optimisation.
    """

    Params: ClassVar[type]
    # Whether the audit grants :attr:`Observation.public` (the server's public data).
    reads_public: ClassVar[bool] = False
    # The threat models whose observations it reads; under the others it is refused in
    # one line (:func:`fedsim.scenario.applicability.check_applies`), or left out of "auto".
    threat_models: ClassVar[frozenset[ThreatModel]] = ALL_THREAT_MODELS
    # Whether ``audit.attacks = "auto"`` runs it where it applies, at :meth:`audit_preset`:
    # fedsim's own are listed in the portfolio's order; a plugin joins after them with True.
    in_auto: ClassVar[bool] = False
    # An ``in_auto`` attack outside the portfolio's list that varies a family (a matching
    # toolkit's class) runs right after the list's first member of that family.
    variant_of: ClassVar[type | None] = None
    # An optimisation attack's step caps for "auto" (None: closed form, nothing to budget).
    step_caps: ClassVar[StepCaps | None] = None

    def __init__(self, params: Any, device: torch.device | str = "cpu") -> None:
        self.params = params
        self.device = torch.device(device)
        self.progress: ProgressFn | None = None

    def report_progress(self, step: int, total: int, objective: torch.Tensor) -> None:
        """After ``step`` of ``total``: tell :attr:`progress` the lowest finite objective,
        on every ``total / PROGRESS_REPORTS``-th step only (a cheap no-op otherwise)."""
        if self.progress is None or (step % max(1, total // PROGRESS_REPORTS) and step != total):
            return
        values = objective.detach().flatten()
        finite = values[torch.isfinite(values)]
        self.progress(step, total, float(finite.min()) if len(finite) else float("inf"))

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Reject, before Ray starts, a setting whose server never sees what this attack
        needs: raise :class:`~fedsim.core.config.ScenarioError`."""
        return None

    @classmethod
    def audit_preset(cls, setting: AttackSetting) -> dict[str, Any]:
        """The parameters ``audit.attacks = "auto"`` runs it with in ``setting``."""
        return {} if cls.step_caps is None else cls.step_caps.params(setting.model.name)

    @abstractmethod
    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        """Recover the victim's batch from ``observation`` alone."""

    def reconstruct_many(
        self, observations: Sequence[Observation], seed: int = 0
    ) -> list[Reconstruction]:
        """Attack several observations (one by one here; batched where an attack can)."""
        return [self.reconstruct(obs, seed) for obs in observations]
