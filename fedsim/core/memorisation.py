"""``[memorisation]``: canaries planted in text clients, their exposure measured every round.

The auditor's design (Carlini et al., "The Secret Sharer"; Thakkar et al. 2021 in
FL): a canary is ``prefix`` followed by ``digits`` random digits; client
``clients[i]`` trains on one canary of its own, ``repetitions[i]`` times, beside
its partition, every round; ``references`` further canaries are drawn and never
planted. The released global model's exposure of each is measured every round
(:mod:`fedsim.text.canaries`). Secrets come from the auditor's
``audit-text-canaries`` stream of ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.core.errors import ScenarioError


def _check(condition: bool, key: str, value: object, allowed: str) -> None:
    if not condition:
        raise ScenarioError(key, value, allowed)


@dataclass(frozen=True)
class MemorisationConfig:
    """Which clients plant a canary, how often, and its format (text data only)."""

    enabled: bool = False
    prefix: str = "my pin is"
    digits: int = 4
    clients: tuple[int, ...] = (0,)
    repetitions: tuple[int, ...] = (10,)
    references: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        _check(1 <= self.digits <= 8, "digits", self.digits, "must be 1 to 8 (|R| = 10**digits)")
        _check(
            len(self.clients) == len(self.repetitions) >= 1,
            "repetitions",
            list(self.repetitions),
            f"one per planting client: clients has {len(self.clients)}",
        )
        _check(
            len(set(self.clients)) == len(self.clients) and min(self.clients) >= 0,
            "clients",
            list(self.clients),
            "distinct partition ids >= 0, each planting one canary",
        )
        _check(
            min(self.repetitions) >= 1,
            "repetitions",
            list(self.repetitions),
            "each >= 1 (a never-planted canary is a reference)",
        )
        _check(self.references >= 0, "references", self.references, "must be >= 0")
        _check(self.seed >= 0, "seed", self.seed, "must be >= 0 (a seed)")
        _check(bool(self.prefix.strip()), "prefix", self.prefix, "must not be empty")
