"""What fedsim's engine asks of a strategy beyond Flower's ``Strategy`` interface.

A fedsim strategy is a Flower strategy (``configure_train`` / ``aggregate_train``
/ ``configure_evaluate`` / ``aggregate_evaluate`` / ``summary``) that also
implements :class:`EngineHooks`: the round-0 model, checkpoint state, the name
of its client routine and how many replies a round needs. The engine calls only
these; wrappers (:class:`~fedsim.audit.wrapper.AuditedStrategy`) forward them
one by one.

A strategy is built like Flower's own, from keyword hyper-parameters with the
papers' defaults (``FedProx(proximal_mu=0.01)``), and runs unchanged in any
ServerApp under ``Strategy.start()`` and under fedsim's round loop: it never
asks what runs it. As in Flower, sampling is the grid's business (fedsim's loop
hands it a view of a :class:`~fedsim.strategies.sampling.SampledGrid` holding
the round's seeded choice, and tells stragglers and checks the failure
threshold there), and evaluation of the global model is a function handed to
the loop (Flower's ``evaluate_fn`` shape; :meth:`ServerResources.evaluate`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedsim.core import protocol
from fedsim.core.data import DatasetBundle
from fedsim.core.devices import torch_threads
from fedsim.core.modality import input_spec, modality
from fedsim.core.models import InputSpec, SplitNet, build_loaded_model
from fedsim.core.seeds import model_init_seed
from fedsim.core.training import evaluate
from fedsim.text.canaries import PlantedCanaries

if TYPE_CHECKING:
    from fedsim.core.config import DataConfig, ModelConfig


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
    """What the server process holds: the model it builds (``model_config``, initialised
    from the federation's ``seed``) and the held-out test set."""

    model_config: ModelConfig
    seed: int
    bundle: DatasetBundle
    device: torch.device
    canaries: PlantedCanaries | None = None  # [memorisation]'s, measured on each global model

    @property
    def input_spec(self) -> InputSpec:
        return input_spec(self.bundle)

    def model(self, arrays: ArrayRecord | None = None) -> SplitNet:
        """The global model on the server's device, loaded with ``arrays``."""
        state = None if arrays is None else arrays.to_torch_state_dict()
        seed = model_init_seed(self.seed)
        return build_loaded_model(self.model_config, self.input_spec, seed, state, self.device)

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Loss and accuracy of the global model on the held-out test set (a text model's
        perplexity too, and ``[memorisation]``'s canaries' exposure): the round loop's
        ``evaluate_fn`` (Flower's shape) for a strategy with a global model."""
        images, labels = self.bundle.test_images, self.bundle.test_labels
        model = self.model(arrays)
        loss, acc = evaluate(model, images, labels)
        metrics: dict[str, int | float | list[int] | list[float]] = {
            protocol.TEST_LOSS: loss,
            protocol.TEST_ACC: acc,
        }
        if modality(self.bundle.modality).perplexity:
            metrics[protocol.TEST_PERPLEXITY] = math.exp(min(loss, 700.0))
        if self.canaries is not None:
            started = time.perf_counter()
            # Small passes (1,000 contexts of a few tokens), often beside the audit's thread:
            # 0.2-0.3 s on one thread, 2.0 s on two on a loaded 2-core machine (same values).
            with torch_threads(1):
                metrics |= self.canaries.measure(model)
            metrics[protocol.MEMORISATION_SECONDS] = time.perf_counter() - started
        return MetricRecord(metrics)


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
    global_model: ClassVar[bool] = True
    """Whether the aggregate is a whole model the server can test on held-out data."""
    weighted_mean: ClassVar[bool] = False
    """Whether the server reads the replies only through their example-weighted mean, all
    that secure aggregation reveals (a threat model hiding replies needs it:
    :attr:`fedsim.core.threat.ThreatModel.hides_replies`)."""
    plain_mean: ClassVar[bool] = False
    """Whether the new global model is the weighted mean of the uploads itself (no server
    optimiser, no robust selection): Flower's central DP calibrates its noise to it."""

    @classmethod
    def from_params(cls, params: Any, **arguments: Any) -> Self:
        """The strategy built from its validated ``Params`` (a scenario's ``[strategy]``)
        and the constructor's other keyword ``arguments``.

        Every ``Params`` field is a keyword argument of the constructor, so the
        scenario machinery builds strategies exactly as a Flower user does.
        """
        fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
        return cls(**fields, **arguments)

    @classmethod
    def server_arguments(cls, server: ServerResources) -> dict[str, Any]:
        """What a run's server gives the constructor besides ``Params`` (a Flower user
        passes the same by hand): by default ``network``, building the seeded model."""
        return {"network": server.model}

    @classmethod
    def check_model(cls, model: ModelConfig, data: DataConfig) -> None:
        """Reject a model (for ``data``) this strategy cannot run (before Ray starts)."""
        return None

    @classmethod
    def departures(cls, params: Any) -> tuple[str, ...]:
        """Where ``params`` (validated ``Params``) depart from what the strategy's
        authors ran, one sentence each: a run's summary and report say them."""
        return ()

    @abstractmethod
    def initial_arrays(self) -> ArrayRecord:
        """The round-0 global model (what the first round sends)."""

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


class StrategyWrapper(FedsimStrategy):
    """Delegates every Flower method and engine hook to ``inner`` (fedsim's strategy or a
    plain Flower one, whose missing hooks get the engine's defaults), one by one: a new
    hook is forwarded here, never reaching the inner strategy by accident. A wrapper
    overrides the calls it changes (:class:`~fedsim.audit.wrapper.AuditedStrategy`)."""

    def __init__(self, inner: Strategy) -> None:
        self.inner = inner

    # -- engine hooks ------------------------------------------------------------

    def initial_arrays(self) -> ArrayRecord:
        if not isinstance(self.inner, EngineHooks):
            raise RuntimeError(f"{type(self.inner).__name__} has no initial model: pass one")
        return self.inner.initial_arrays()

    def state_for_checkpoint(self) -> dict[str, Any]:
        if not isinstance(self.inner, EngineHooks):
            return {}
        return self.inner.state_for_checkpoint()

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        if isinstance(self.inner, EngineHooks):
            self.inner.restore_checkpoint_state(state)

    # -- Flower's Strategy ---------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.inner.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.inner.aggregate_train(server_round, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.inner.summary()
