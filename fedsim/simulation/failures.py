"""Injected client failures, decided by the server from the seed, enacted by the client.

Each round a fixed share of the sampled clients fails (``failures.fraction``
of them, rounded half up), chosen from ``(seed, round)``: a repeated or
resumed run fails the same clients. The server marks those clients' training
messages (:func:`mark`); the client-side Flower mod
:func:`fedsim.clients.failures.inject_failures` acts on the mark:

- ``raise``: the client raises instead of training; Flower turns that into an
  error reply.
- ``timeout``: the client stays silent until the server's reply deadline has
  passed, then gives up; the server has stopped waiting and counts it failed.

A marked client does no work and changes no state (a raising ClientApp's
context is not written back), so a failure never leaves half-updated
client-private state behind.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from flwr.app import ConfigRecord, Message

from fedsim.clients.failures import INJECTED_MARKER
from fedsim.core import protocol
from fedsim.core.config import FailureConfig, ScenarioError
from fedsim.core.seeds import SeedStream, choose
from fedsim.strategies.base import required_replies, with_record


def failing_count(fraction: float, sampled: int) -> int:
    """How many of ``sampled`` clients an injected ``fraction`` fails (rounded half up)."""
    return math.floor(fraction * sampled + 0.5)


def check_failures(cfg: FailureConfig, sampled: int, strategy_min_replies: float) -> None:
    """Reject injected failures that leave every round short of replies, ``sampled``
    clients a round (before Ray)."""
    min_fraction = cfg.min_replies or strategy_min_replies
    needed = required_replies(min_fraction, sampled)
    failing = failing_count(cfg.fraction, sampled)
    if sampled - failing < needed:
        raise ScenarioError(
            "failures.fraction",
            cfg.fraction,
            f"fails {failing} of the {sampled} clients sampled per round, but the strategy "
            f"needs {needed} replies (min-replies {min_fraction}); lower it or set "
            "failures.min-replies",
        )


@dataclass(frozen=True)
class FailurePlan:
    """Which sampled partitions fail in a round, and how."""

    seed: int
    fraction: float
    kind: str

    @classmethod
    def from_config(cls, cfg: FailureConfig, seed: int) -> FailurePlan | None:
        """The plan for a scenario, or ``None`` when it injects nothing."""
        return cls(seed, cfg.fraction, cfg.kind) if cfg.fraction > 0 else None

    def failing(self, server_round: int, partitions: Sequence[int]) -> list[int]:
        """The partitions among ``partitions`` that fail in ``server_round``."""
        count = failing_count(self.fraction, len(partitions))
        return choose(partitions, count, SeedStream.FAILURES, self.seed, server_round)


def mark(message: Message, kind: str, deadline: float) -> Message:
    """A copy of ``message`` that tells its client to fail (``kind``) this round.

    ``deadline`` (``time.time()``) is when the server stops waiting for replies.
    """
    return with_record(
        message, protocol.FAILURE, ConfigRecord({"kind": kind, "deadline": deadline})
    )


class HideInjectedFailures(logging.Filter):
    """Drops Flower's error logs for injected failures: they are expected, and in ``clients.csv``.

    Flower logs a client's exception and its traceback, each naming it, after
    a generic line that names no client; that line is dropped for every error,
    real client errors still show their own two.
    """

    GENERIC = "An exception was raised when processing a message by RayBackend"

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return INJECTED_MARKER not in message and message != self.GENERIC
