"""The round loop: a template that drives any Flower strategy.

It runs the same phases as ``flwr``'s ``Strategy.start`` (configure_train,
send, aggregate_train, configure_evaluate, send, aggregate_evaluate, global
evaluation) but can start at any round (resume), counts failed replies, and
hands a :class:`RoundRecord` to callbacks after every round, so recording,
checkpointing and auditing observe the loop instead of changing it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy


@dataclass
class RoundRecord:
    """Everything one round produced, for callbacks."""

    round: int
    seconds: float
    sampled: int
    replies: int
    failures: int
    train: dict[str, float] = field(default_factory=dict)
    evaluate: dict[str, float] = field(default_factory=dict)
    server: dict[str, float] = field(default_factory=dict)
    clients: list[dict[str, Any]] = field(default_factory=list)


class RoundCallback(Protocol):
    """Observes the loop; called after each round with the new global model."""

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> None: ...


def _client_rows(server_round: int, phase: str, replies: Iterable[Message]) -> list[dict[str, Any]]:
    rows = []
    for reply in replies:
        if reply.has_error():
            continue
        metrics = reply.content.metric_records.get("metrics")
        rows.append({"round": server_round, "phase": phase, **dict(metrics or {})})
    return rows


def _scalars(metrics: MetricRecord | None) -> dict[str, float]:
    if metrics is None:
        return {}
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def run_rounds(
    strategy: Strategy,
    grid: Grid,
    arrays: ArrayRecord,
    rounds: Sequence[int],
    train_config: dict[str, Any],
    evaluate_config: dict[str, Any],
    callbacks: Sequence[RoundCallback] = (),
    timeout: float = 3600.0,
) -> ArrayRecord:
    """Run ``rounds`` of federated training; return the final global model."""
    evaluate_global = getattr(strategy, "evaluate_global", None)
    for server_round in rounds:
        started = time.perf_counter()
        train_messages = list(
            strategy.configure_train(server_round, arrays, ConfigRecord(train_config), grid)
        )
        train_replies = (
            list(grid.send_and_receive(train_messages, timeout=timeout)) if train_messages else []
        )
        new_arrays, train_metrics = strategy.aggregate_train(server_round, train_replies)
        if new_arrays is not None:
            arrays = new_arrays

        eval_messages = list(
            strategy.configure_evaluate(server_round, arrays, ConfigRecord(evaluate_config), grid)
        )
        eval_replies = (
            list(grid.send_and_receive(eval_messages, timeout=timeout)) if eval_messages else []
        )
        eval_metrics = strategy.aggregate_evaluate(server_round, eval_replies)
        server_metrics = evaluate_global(server_round, arrays) if evaluate_global else None

        failures = sum(r.has_error() for r in train_replies)
        record = RoundRecord(
            round=server_round,
            seconds=time.perf_counter() - started,
            sampled=len(train_messages),
            replies=len(train_replies) - failures,
            failures=failures + (len(train_messages) - len(train_replies)),
            train=_scalars(train_metrics),
            evaluate=_scalars(eval_metrics),
            server=dict(server_metrics or {}),
            clients=_client_rows(server_round, "train", train_replies)
            + _client_rows(server_round, "evaluate", eval_replies),
        )
        for callback in callbacks:
            callback.on_round_end(record, arrays)
    return arrays
