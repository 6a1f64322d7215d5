"""User-level canary clients (Andrew et al., ICLR 2024: one-shot empirical privacy estimation).

Each canary client has a random direction (uniform on the unit sphere of the uploaded
parameters) and, every round it takes part, uploads the sent model moved by the clipping
norm along it: an update that clipping leaves unchanged, and the largest it allows. As many
directions again are drawn and never inserted. After the run, the cosines between the final
model's change and each direction, inserted and unseen, give the estimate
(:func:`fedsim.core.empirical_privacy.cosine_epsilon`). The auditor designs the canaries
(the ``audit-canary-clients`` stream); nothing here reads a real client's data.

:func:`fedsim.simulation.canary_run.run_with_canary_clients` runs a federation with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fedsim.core import protocol
from fedsim.core.config import require
from fedsim.core.empirical_privacy import CosineEstimate, cosine_epsilon
from fedsim.core.seeds import SeedStream, stream_rng


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
