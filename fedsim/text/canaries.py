"""``[memorisation]``'s canaries: planted in text clients' data, exposed by the global model.

:class:`PlantedCanaries` turns a :class:`~fedsim.core.memorisation.MemorisationConfig`
and a dataset's vocabulary into Carlini et al.'s canaries (:mod:`fedsim.text.exposure`):
the prefix's tokens, then ``digits`` digit tokens (in vocabulary in every word
vocabulary, :data:`~fedsim.text.tokens.CANARY_TOKENS`; LEAF's characters hold them,
one character each after a space). A planting client's canary window starts with
the canary and is filled with the vocabulary's unknown token; it is repeated as
often as the scenario says. The exposure of every canary is measured on a model
(the released global one) against every secret of ``R`` when ``|R|`` is at most
10,000 (exact rank, the model read as a trie:
:func:`~fedsim.text.exposure.space_log_perplexity`), else by the paper's skew-normal
fit to 1,000 random secrets.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import nn

from fedsim.core.data import DatasetBundle
from fedsim.core.memorisation import MemorisationConfig
from fedsim.core.seeds import SeedStream, derive_seed
from fedsim.text.exposure import CanaryFormat, exposures
from fedsim.text.tokens import Vocabulary

EXACT_LIMIT = 10_000
"""The largest ``|R|`` ranked exactly, every round: 4 digits. Read as a trie, 10,000 secrets
took 0.19 s on one loaded core for the small transformer, against 0.7 s for the skew-normal
fit to 1,000 random secrets scored one by one (2-3 s for all 10,000 one by one)."""
REFERENCE_DRAWS = 1000
"""Random secrets the skew-normal fit reads where ``R`` is larger."""


@lru_cache(maxsize=4)
def vocabulary_of(tokens: tuple[str, ...]) -> Vocabulary:
    """A bundle's vocabulary as a :class:`Vocabulary`: characters when every token is one.
    Kept: a client builds its canary from it for every message (5-6 ms a time uncached)."""
    if all(len(t) == 1 for t in tokens):
        return Vocabulary(tokens, "char", tokens.index(" "))
    return Vocabulary(tokens, "word", 0)


@dataclass(frozen=True)
class PlantedCanaries:
    """The canaries of one run: the format, each planting client's secret, the references."""

    config: MemorisationConfig
    format: CanaryFormat
    planted: tuple[tuple[int, ...], ...]
    references: tuple[tuple[int, ...], ...]
    filler: int

    @classmethod
    def of(cls, config: MemorisationConfig, tokens: tuple[str, ...]) -> PlantedCanaries:
        """The canaries ``config`` asks for, in the vocabulary ``tokens``."""
        vocabulary = vocabulary_of(tokens)
        space = " " if vocabulary.level == "char" else ""
        prefix = tuple(int(i) for i in vocabulary.encode(config.prefix.strip() + space))
        alphabet = tuple(int(vocabulary.encode(str(d))[0]) for d in range(10))
        fmt = CanaryFormat(prefix, alphabet, config.digits)
        seed = derive_seed(SeedStream.AUDIT_TEXT_CANARIES, config.seed)
        drawn = fmt.draw(
            len(config.clients) + config.references, torch.Generator().manual_seed(seed)
        )
        secrets = [tuple(int(t) for t in row[len(prefix) :]) for row in drawn]
        count = len(config.clients)
        return cls(config, fmt, tuple(secrets[:count]), tuple(secrets[count:]), vocabulary.unknown)

    def windows(self, client: int, length: int) -> torch.Tensor | None:
        """Client ``client``'s canary windows ``(repetitions, length + 1)``; ``None`` for a
        client that plants none."""
        if client not in self.config.clients:
            return None
        at = self.config.clients.index(client)
        canary = self.format.sequence(self.planted[at])[: length + 1]
        window = torch.full((length + 1,), self.filler, dtype=torch.long)
        window[: len(canary)] = canary
        return window.expand(self.config.repetitions[at], -1).clone()

    def names(self) -> list[str]:
        """Each canary's metric name: planted ones by client and repetitions, then references."""
        planted = [
            f"exposure-client{c}-x{r}"
            for c, r in zip(self.config.clients, self.config.repetitions, strict=True)
        ]
        return planted + [f"exposure-reference{i}" for i in range(len(self.references))]

    def measure(self, model: nn.Module) -> dict[str, float]:
        """Every canary's exposure in bits under ``model``, by :meth:`names`."""
        generator = torch.Generator().manual_seed(
            derive_seed(SeedStream.AUDIT_TEXT_CANARIES, self.config.seed)
        )
        found = exposures(
            model,
            self.format,
            [*self.planted, *self.references],
            reference=REFERENCE_DRAWS,
            generator=generator,
            exact_limit=EXACT_LIMIT,
        )
        return {name: e.value for name, e in zip(self.names(), found, strict=True)}


def planted_windows(
    bundle: DatasetBundle, config: MemorisationConfig, client: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Client ``client``'s canary windows and their (unread) labels, ``None`` if it plants
    none: what it trains on besides its partition."""
    canaries = PlantedCanaries.of(config, bundle.vocabulary)
    windows = canaries.windows(client, int(bundle.train_images.shape[1]) - 1)
    if windows is None:
        return None
    return windows, torch.zeros(len(windows), dtype=torch.long)
