"""A strategy wrapper that lets the audit see what the server receives.

Like Flower's differential-privacy wrappers, :class:`AuditedStrategy` wraps
any ``Strategy`` (fedsim's, or Flower's own such as ``FedAvg`` or ``Krum``)
and delegates every call. It records the model and config it sends in
``configure_train`` and passes the very same reply messages, in the same
order, to the wrapped ``aggregate_train``; the auditor only reads them, so the
aggregate is bit-identical with and without the audit.

In any Flower ServerApp::

    dlg = resolve(ATTACKS, ComponentConfig("dlg", {"steps": 300}), "attack")
    auditor = Auditor(AuditConfig(...), [dlg], ServerView(...), None, run_dir, console)
    result = AuditedStrategy(FedCG(network=...), auditor).start(grid, initial_arrays, ...)

``start`` joins the outstanding attacks before it returns (``audit.csv`` is
complete then). Without a truth source the reconstructions are recorded
unscored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedsim.audit.observe import InterceptedRound, intercept
from fedsim.core import protocol
from fedsim.strategies.base import StrategyWrapper


class ReplyObserver(Protocol):
    """Receives what the server sent and got back in the training rounds it audits."""

    def audits_round(self, server_round: int) -> bool:
        """Whether ``server_round``'s replies are to be read at all."""
        ...

    def observe_round(self, intercepted: InterceptedRound) -> None:
        """A round's sent model and config and its replies, each read once."""

    def finish(self) -> None:
        """Complete what was observed (called when Flower's ``start`` returns)."""


class AuditedStrategy(StrategyWrapper):
    """Delegates to ``inner``; shows each training round to ``observer``."""

    def __init__(self, inner: Strategy, observer: ReplyObserver) -> None:
        super().__init__(inner)
        self.observer = observer
        self._sent: tuple[ArrayRecord, ConfigRecord] | None = None

    def start(self, *args: Any, **kwargs: Any) -> Result:
        """Flower's round loop over the wrapped strategy; returns once every attack is done."""
        try:
            return super().start(*args, **kwargs)
        finally:
            self.observer.finish()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = list(self.inner.configure_train(server_round, arrays, config, grid))
        if messages:
            # What actually went out (a strategy may send a subset of the model).
            first = messages[0].content
            self._sent = (
                first.array_records[protocol.ARRAYS],
                first.config_records[protocol.CONFIG],
            )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        # Observe first: some aggregators take the arrays out of the replies
        # (Flower's FedMedian pops them); the observer only reads.
        if self._sent is not None and self.observer.audits_round(server_round):
            ok = [r for r in replies if not r.has_error()]
            self.observer.observe_round(intercept(server_round, *self._sent, ok))
        return self.inner.aggregate_train(server_round, replies)
