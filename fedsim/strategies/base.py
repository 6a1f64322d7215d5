"""What fedsim's engine asks of a strategy beyond Flower's ``Strategy`` interface.

A fedsim strategy is a Flower strategy (``configure_train`` / ``aggregate_train``
/ ``configure_evaluate`` / ``aggregate_evaluate`` / ``summary``) that also
implements :class:`EngineHooks`: the round-0 model, an optional global
evaluation, checkpoint state, the name of its client routine and how many
replies a round needs. The engine calls only these; wrappers
(:class:`~fedsim.audit.wrapper.AuditedStrategy`) forward them one by one.

A strategy is built like Flower's own, from keyword hyper-parameters with the
papers' defaults (``FedProx(proximal_mu=0.01)``), and then runs in any
ServerApp under ``Strategy.start()``: it samples node ids from the grid and
evaluates no global model, as Flower's strategies do. fedsim's engine attaches
its services separately (:meth:`FedsimStrategy.attach_engine`): seeded
sampling by partition id, the held-out test set and the round-0 model, and the
scenario's failure threshold.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

import torch
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.serverapp.strategy import Strategy

from fedsim.core.data import DatasetBundle
from fedsim.core.models import InputSpec, SplitNet, build_loaded_model
from fedsim.core.seeds import model_init_seed
from fedsim.strategies.sampling import PartitionSampler
from fedsim.strategies.stragglers import StragglerPlan

if TYPE_CHECKING:
    from fedsim.core.config import Scenario


class TooFewReplies(RuntimeError):
    """A round got fewer training replies than its strategy accepts."""


def required_replies(min_fraction: float, sampled: int) -> int:
    """Training replies a round of ``sampled`` clients needs (at least one)."""
    return max(1, math.ceil(min_fraction * sampled - 1e-9))


def with_record(message: Message, key: str, record: Any) -> Message:
    """A copy of ``message`` whose content holds ``record`` under ``key``.

    Strategies send one shared ``RecordDict`` to every client, so what one
    client alone is told goes on a shallow copy.
    """
    content = RecordDict(dict(message.content.items()))
    content[key] = record
    return Message(
        content=content,
        dst_node_id=message.metadata.dst_node_id,
        message_type=message.metadata.message_type,
        group_id=message.metadata.group_id,
    )


@dataclass
class ServerResources:
    """What the server process holds: the scenario and the held-out test set."""

    scenario: Scenario
    bundle: DatasetBundle
    device: torch.device

    @property
    def input_spec(self) -> InputSpec:
        b = self.bundle
        return InputSpec(b.channels, b.image_size, b.num_classes)

    def model(self, arrays: ArrayRecord | None = None) -> SplitNet:
        """The global model on the server's device, loaded with ``arrays``."""
        state = None if arrays is None else arrays.to_torch_state_dict()
        seed = model_init_seed(self.scenario.federation.seed)
        return build_loaded_model(self.scenario.model, self.input_spec, seed, state, self.device)


@dataclass(frozen=True)
class EngineServices:
    """What fedsim's engine lends a strategy: seeded sampling, the server's data, thresholds.

    ``min_replies`` overrides the strategy's own fraction (scenario key
    ``failures.min-replies``); ``None`` keeps the strategy's. ``stragglers``:
    who straggles each round (scenario key ``federation.stragglers``), or ``None``.
    """

    sampler: PartitionSampler
    server: ServerResources
    min_replies: float | None = None
    stragglers: StragglerPlan | None = None


class EngineHooks(ABC):
    """The hooks fedsim's engine calls on a strategy, besides Flower's interface."""

    Params: ClassVar[type]
    """Frozen dataclass of the strategy's hyper-parameters (a scenario's ``[strategy]``)."""
    client_routine: ClassVar[str]
    """The client routine (``fedsim.clients`` registry name) that answers this strategy."""
    min_replies: ClassVar[float] = 0.5
    """A round aggregates when at least this fraction of the sampled clients replied."""
    shared_prefixes: ClassVar[tuple[str, ...] | None] = None
    """Parameter-name prefixes the clients upload; ``None``: the whole model."""
    straggler_replies: ClassVar[Literal["drop", "aggregate"] | None] = None
    """What the strategy does with a straggler's partial work (``federation.stragglers``);
    ``None``: it cannot run stragglers."""

    @classmethod
    def from_params(cls, params: Any) -> Self:
        """The strategy built from its validated ``Params`` (a scenario's ``[strategy]``).

        Every ``Params`` field is a keyword argument of the constructor, so the
        scenario machinery builds strategies exactly as a Flower user does.
        """
        return cls(**{f.name: getattr(params, f.name) for f in dataclasses.fields(params)})

    @classmethod
    def check_scenario(cls, scenario: Scenario) -> None:
        """Reject scenario settings this strategy cannot run (before Ray starts)."""
        return None

    @abstractmethod
    def initial_arrays(self) -> ArrayRecord:
        """The round-0 global model (what the first round sends)."""

    def evaluate_global(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        """Metrics of the global model on the server's held-out data, or ``None``."""
        return None

    def state_for_checkpoint(self) -> dict[str, Any]:
        """Strategy state a resumed run needs besides the global model.

        Called after every round; the values must load with
        ``torch.load(weights_only=True)``: tensors, numbers, strings, and
        lists or dicts of them.
        """
        return {}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state_for_checkpoint` returned, before the first resumed round."""
        return None


class FedsimStrategy(Strategy, EngineHooks):
    """A Flower ``Strategy`` with the engine's hooks: what the round loop drives."""

    engine: EngineServices | None = None

    def attach_engine(self, engine: EngineServices) -> Self:
        """Use the engine's sampling, held-out evaluation and thresholds; returns ``self``."""
        self.engine = engine
        return self

    def require_engine(self, what: str) -> EngineServices:
        """The attached services, or a clear error naming what needed them."""
        if self.engine is None:
            raise RuntimeError(
                f"{type(self).__name__}: {what} needs fedsim's engine (attach_engine); "
                "under Flower's Strategy.start() pass initial_arrays yourself"
            )
        return self.engine
