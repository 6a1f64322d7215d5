"""The round loop: a template that drives any Flower strategy.

It runs the same phases as ``flwr``'s ``Strategy.start`` (configure_train,
send, aggregate_train, configure_evaluate, send, aggregate_evaluate, global
evaluation by an ``evaluate_fn`` of Flower's shape) but can start at any round
(resume), samples through a :class:`~fedsim.strategies.sampling.SampledGrid`
(seeded by partition id, with stragglers and the failure threshold), waits for
replies only until a deadline, injects failures, records which clients failed,
and hands a :class:`RoundRecord` to callbacks after every round, so recording,
checkpointing and auditing observe the loop instead of changing it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from fedsim.core import protocol
from fedsim.simulation.failures import FailurePlan, mark
from fedsim.strategies.base import FedsimStrategy
from fedsim.strategies.sampling import SampledGrid

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]  # Flower's evaluate_fn

POLL_S = 0.02  # between pulls for replies (Flower's own send_and_receive sleeps 0.1 s)


class RoundCallback(Protocol):
    """Observes the loop; called after each round with the new global model.

    It may return metrics of its own for the round (the audit's verdict): the loop
    adds them to the record the callbacks after it receive (the recorder writes
    them); no callback edits the record.
    """

    def on_round_end(
        self, record: protocol.RoundRecord, arrays: ArrayRecord
    ) -> Mapping[str, float] | None: ...


class Exchange:
    """Sends one phase's messages and collects the replies that arrive before a deadline.

    Replies come back sorted by partition: aggregation sums floats in reply
    order, and arrival order varies between runs. Clients the failure plan
    picks get a marked message; stragglers' messages go out after the others
    are answered, since a straggler holds its Ray actor until the deadline and
    healthy clients queued behind it would time out too. Messages left
    unanswered are pulled (and so deleted from Flower's store) later, because
    the simulation scans its whole message store ten times a second.
    """

    def __init__(
        self,
        grid: Grid,
        timeout: float,
        partition_of: Mapping[int, int],
        failures: FailurePlan | None = None,
    ) -> None:
        self.grid = grid
        self.timeout = timeout
        self.partition_of = partition_of
        self.failures = failures
        self._abandoned: set[str] = set()

    def client_id(self, node_id: int) -> int:
        """Partition id of ``node_id``."""
        return self.partition_of[node_id]

    def send_and_receive(
        self, server_round: int, messages: list[Message], inject: bool = False
    ) -> tuple[list[Message], dict[int, str]]:
        """Replies (sorted by client) and the failed clients (id -> ``error``/``timeout``)."""
        deadline = time.time() + self.timeout
        self._forget_abandoned()
        failing: set[int] = set()
        if inject and self.failures is not None:
            ids = [self.client_id(m.metadata.dst_node_id) for m in messages]
            failing = set(self.failures.failing(server_round, ids))
        plan_kind = self.failures.kind if self.failures is not None else "raise"
        healthy = [m for m in messages if self.client_id(m.metadata.dst_node_id) not in failing]
        marked = [
            mark(m, plan_kind, deadline)
            for m in messages
            if self.client_id(m.metadata.dst_node_id) in failing
        ]
        first, later = (healthy, marked) if plan_kind == "timeout" else (healthy + marked, [])
        replies = self._collect(first, deadline) + self._collect(later, deadline)
        replies.sort(key=lambda r: self.client_id(r.metadata.src_node_id))
        self._check_partitions(replies)
        failed = {self.client_id(m.metadata.dst_node_id): "timeout" for m in messages}
        for reply in replies:
            client = self.client_id(reply.metadata.src_node_id)
            if reply.has_error():
                failed[client] = "error"
            else:
                del failed[client]
        return replies, failed

    def _collect(self, messages: list[Message], deadline: float) -> list[Message]:
        if not messages:
            return []
        if not hasattr(self.grid, "push_messages"):  # a minimal grid (in-process tests)
            return list(self.grid.send_and_receive(messages, timeout=self.timeout))
        pending = set(self.grid.push_messages(messages))
        replies: list[Message] = []
        while pending and time.time() < deadline:
            got = list(self.grid.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(r.metadata.reply_to_message_id for r in got)
            if pending:
                time.sleep(POLL_S)
        self._abandoned |= pending
        return replies

    def _forget_abandoned(self) -> None:
        if self._abandoned:
            got = self.grid.pull_messages(self._abandoned)
            self._abandoned.difference_update(r.metadata.reply_to_message_id for r in got)

    def _check_partitions(self, replies: list[Message]) -> None:
        # The node -> partition map may come from Flower internals (see
        # fedsim.strategies.sampling); every reply names its partition, so check it.
        for reply in replies:
            if reply.has_error() or protocol.METRICS not in reply.content.metric_records:
                continue
            claimed = reply.content.metric_records[protocol.METRICS].get(protocol.PARTITION_ID)
            expected = self.partition_of[reply.metadata.src_node_id]
            if claimed is not None and claimed != expected:
                raise RuntimeError(
                    f"node {reply.metadata.src_node_id} replied as partition {claimed}, "
                    f"but the server mapped it to partition {expected}"
                )


def _client_rows(
    server_round: int,
    phase: str,
    replies: Iterable[Message],
    failed: Mapping[int, str],
) -> list[dict[str, Any]]:
    rows = [
        {
            protocol.ROUND: server_round,
            protocol.PHASE: phase,
            **dict(reply.content[protocol.METRICS]),
        }
        for reply in replies
        if not reply.has_error() and protocol.METRICS in reply.content.metric_records
    ]
    rows += [
        {
            protocol.ROUND: server_round,
            protocol.PHASE: phase,
            protocol.PARTITION_ID: client,
            protocol.FAILURE_KIND: kind,
        }
        for client, kind in failed.items()
    ]
    return sorted(rows, key=lambda row: row.get(protocol.PARTITION_ID, -1))


def _scalars(metrics: MetricRecord | None) -> dict[str, float]:
    if metrics is None:
        return {}
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def run_rounds(
    strategy: FedsimStrategy,
    grid: SampledGrid,
    arrays: ArrayRecord,
    rounds: Sequence[int],
    train_config: dict[str, Any],
    evaluate_config: dict[str, Any],
    callbacks: Sequence[RoundCallback] = (),
    timeout: float = 3600.0,
    failures: FailurePlan | None = None,
    evaluate_fn: EvaluateFn | None = None,
) -> ArrayRecord:
    """Run ``rounds`` of federated training; return the final global model.

    ``grid`` samples each phase's clients (the strategy is handed a view of
    the sampled nodes only), tells stragglers and checks the failure threshold;
    ``timeout`` bounds each phase's wait for replies; ``failures`` injects
    client failures into training; ``evaluate_fn`` tests the global model
    after each round (``None``: a strategy without one).
    """
    exchange = Exchange(grid.grid, timeout, grid.partition_of, failures)
    for server_round in rounds:
        started = time.perf_counter()
        # The strategy samples from a view offering only this phase's seeded choice.
        view: Any = grid.train_view(server_round)
        asked = strategy.configure_train(server_round, arrays, ConfigRecord(train_config), view)
        train_messages = grid.outgoing(server_round, view, asked, train=True)
        train_replies, failed = exchange.send_and_receive(server_round, train_messages, True)
        grid.check_replies(server_round, len(train_messages), train_replies)
        new_arrays, train_metrics = strategy.aggregate_train(server_round, train_replies)
        if new_arrays is not None:
            arrays = new_arrays

        view = grid.evaluate_view(server_round)
        config = ConfigRecord(evaluate_config)
        asked = strategy.configure_evaluate(server_round, arrays, config, view)
        eval_messages = grid.outgoing(server_round, view, asked, train=False)
        eval_replies, eval_failed = exchange.send_and_receive(server_round, eval_messages)
        eval_metrics = strategy.aggregate_evaluate(server_round, eval_replies)
        server_metrics = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None

        record = protocol.RoundRecord(
            round=server_round,
            seconds=time.perf_counter() - started,
            sampled=len(train_messages),
            replies=len(train_messages) - len(failed),
            failures=len(failed),
            train=_scalars(train_metrics),
            evaluate=_scalars(eval_metrics),
            server=_scalars(server_metrics),
            clients=_client_rows(server_round, "train", train_replies, failed)
            + _client_rows(server_round, "evaluate", eval_replies, eval_failed),
            failed=failed,
        )
        for callback in callbacks:
            metrics = callback.on_round_end(record, arrays)
            if metrics:
                record = dataclasses.replace(record, server={**record.server, **metrics})
    return arrays
