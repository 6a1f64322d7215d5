"""User-level canary clients (Andrew et al., ICLR 2024: one-shot empirical privacy estimation).

Each canary client has a random direction (uniform on the unit sphere of the uploaded
parameters) and, every round it takes part, uploads the sent model moved by the clipping
norm along it: an update that clipping leaves unchanged, and the largest it allows. As many
directions again are drawn and never inserted. After the run, the cosines between the final
model's change and each direction, inserted and unseen, give the estimate
(:func:`fedsim.core.empirical_privacy.cosine_epsilon`). The auditor designs the canaries
(the ``audit-canary-clients`` stream); nothing here reads a real client's data.

:class:`WithCanaryClients` puts them into a run's aggregation (``audit.canary-clients``);
:func:`fedsim.simulation.canary_run.run_with_canary_clients` runs a federation with them in
process, for the bench and tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fedsim.core import protocol
from fedsim.core.config import require
from fedsim.core.empirical_privacy import CosineEstimate, cosine_epsilon
from fedsim.core.seeds import SeedStream, stream_rng
from fedsim.strategies.base import FedsimStrategy, StrategyWrapper


def _flat(record: ArrayRecord) -> np.ndarray:
    return np.concatenate([a.numpy().ravel().astype(np.float64) for a in record.values()])


@dataclass
class CanaryClients:
    """``inserted`` canary clients and as many unseen directions, over ``template``'s arrays."""

    inserted: int
    template: ArrayRecord
    seed: int

    def __post_init__(self) -> None:
        require(self.inserted >= 2, "canary-clients", self.inserted, "must be >= 2")
        size = sum(a.numpy().size for a in self.template.values())
        rng = stream_rng(SeedStream.AUDIT_CANARY_CLIENTS, self.seed)
        directions = rng.standard_normal((2 * self.inserted, size), dtype=np.float32)
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        self.directions = directions  # the first ``inserted`` rows go in

    def replies(self, sent: ArrayRecord, clipping_norm: float, like: MetricRecord) -> list[Message]:
        """Every inserted canary's train reply to ``sent``, its metrics a copy of a real
        reply's ``like`` (Flower's FedAvg aggregates only replies with the same keys, and
        weighs them by its example count) under a partition id of its own (-1, -2, ...)."""
        base = _flat(sent)
        replies = []
        for index in range(self.inserted):
            moved = base + clipping_norm * self.directions[index].astype(np.float64)
            arrays, start = {}, 0
            for name, array in sent.items():
                values = array.numpy()
                part = moved[start : start + values.size].reshape(values.shape)
                arrays[name] = Array(part.astype(values.dtype))
                start += values.size
            metrics = MetricRecord(dict(like))
            metrics[protocol.PARTITION_ID] = -1 - index
            content = RecordDict({protocol.ARRAYS: ArrayRecord(arrays), protocol.METRICS: metrics})
            replies.append(Message(content, dst_node_id=0, message_type="train"))
        return replies

    def estimate(self, initial: ArrayRecord, final: ArrayRecord, delta: float) -> CosineEstimate:
        """The estimate from the model's change over the run (the auditor's bootstrap)."""
        change = _flat(final) - _flat(initial)
        cosines = self.directions.astype(np.float64) @ change / np.linalg.norm(change)
        rng = stream_rng(SeedStream.AUDIT_BOOTSTRAP, self.seed, 0)
        return cosine_epsilon(cosines[: self.inserted], cosines[self.inserted :], delta, rng)


class _WithCanaryNodes:
    """A grid view offering the round's clients and one made-up node per canary client:
    Flower's central-DP wrapper checks that it configures as many clients as it noises."""

    def __init__(self, view: Grid, canaries: int) -> None:
        self.view = view
        real = list(view.get_node_ids())
        taken = set(real)
        free = (node for node in range(1, len(real) + canaries + 1) if node not in taken)
        self.canary_nodes = {next(free) for _ in range(canaries)}
        self.node_ids = real + sorted(self.canary_nodes)

    def get_node_ids(self) -> list[int]:
        return self.node_ids


class WithCanaryClients(StrategyWrapper):
    """Flower's central-DP wrapper ``inner`` (built for the clients plus ``canaries``'s)
    with the canary clients' replies added to every round's aggregation.

    Each round's train metrics carry Andrew et al.'s estimate from the model's change
    since round 0 (``central-dp-epsilon-empirical`` and its interval) beside the
    accountant's ``central-dp-epsilon``. The canaries move the released model too (their
    share of the mean is ``canaries / (sampled + canaries)``): accuracy is that model's.
    """

    def __init__(
        self, inner: FedsimStrategy, canaries: CanaryClients, clipping_norm: float, delta: float
    ) -> None:
        super().__init__(inner)
        self.canaries = canaries
        self.clipping_norm = clipping_norm
        self.delta = delta
        self.initial = inner.initial_arrays()  # seeded: the same after a resume
        self.estimate: CosineEstimate | None = None
        self._sent: ArrayRecord | None = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._sent = arrays
        view = _WithCanaryNodes(grid, self.canaries.inserted)
        messages = self.inner.configure_train(server_round, arrays, config, view)  # type: ignore[arg-type]
        return [m for m in messages if m.metadata.dst_node_id not in view.canary_nodes]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        answered = [r for r in replies if not r.has_error()]
        if self._sent is not None and answered:
            like = answered[0].content.metric_records[protocol.METRICS]
            replies += self.canaries.replies(self._sent, self.clipping_norm, like)
        arrays, metrics = self.inner.aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        self.estimate = estimate = self.canaries.estimate(self.initial, arrays, self.delta)
        metrics = metrics if metrics is not None else MetricRecord()
        metrics[protocol.CENTRAL_DP_EPSILON_EMPIRICAL] = estimate.epsilon
        metrics[protocol.CENTRAL_DP_EPSILON_EMPIRICAL_LOW] = estimate.low
        metrics[protocol.CENTRAL_DP_EPSILON_EMPIRICAL_HIGH] = estimate.high
        return arrays, metrics
