"""``words``: which tokens a text client used this round, from its token-embedding update.

The analysis of :mod:`fedsim.text.words` on the server's view: the embedding
rows of the upload (an update, or a probe's gradient) against the rows it sent.
For a word-level model this is the client's exact word set at any client size;
the output layer is not read (its softmax moves every row). Beside it, the
frequency prior: the most frequent tokens of the server's public text.
"""

from __future__ import annotations

import time
from typing import ClassVar

import torch

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.leakage import LEAKS, LeakAnalysis, LeakInput, WordsLeak
from fedsim.core.config import require
from fedsim.core.params.leaks import WordsParams
from fedsim.core.raw import TEXT
from fedsim.core.threat import ONE_CLIENT
from fedsim.text.models import TOKEN_EMBEDDING
from fedsim.text.words import frequency_prior, used_tokens


def embedding_rows(observation: Observation) -> tuple[torch.Tensor, torch.Tensor]:
    """The token embedding as sent and as uploaded (``ValueError`` when it was not)."""
    if TOKEN_EMBEDDING not in observation.shared:
        raise ValueError(f"words reads {TOKEN_EMBEDDING}; the upload holds none")
    return observation.global_params[TOKEN_EMBEDDING], observation.shared[TOKEN_EMBEDDING]


@LEAKS.register("words")
class EmbeddingWords(LeakAnalysis):
    """The tokens whose embedding rows the client's data moved (Melis et al., S&P 2019)."""

    Params = WordsParams
    kind = "words"
    modality: ClassVar[str] = TEXT
    threat_models = ONE_CLIENT  # one client's embedding rows: a mean mixes every client's

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """The token embedding must be uploaded."""
        uploads = setting.uploads
        require(
            uploads is None or any(TOKEN_EMBEDDING.startswith(p) for p in uploads),
            f"{key}.name",
            "words",
            f"reads the client's token embedding ({TOKEN_EMBEDDING}); strategy "
            f"{setting.strategy!r} does not upload it",
        )

    def analyse(self, inputs: LeakInput, seed: int = 0) -> WordsLeak:
        """The rows that moved, and the frequency prior of as many tokens."""
        start = time.perf_counter()
        observation = inputs.observation
        sent, received = embedding_rows(observation)
        if observation.shared_kind == "gradient":
            tokens = torch.nonzero(received.abs().amax(dim=1) > 0).flatten()
        else:
            tokens = used_tokens(
                sent,
                received,
                observation.train_config,
                observation.num_examples,
                observation.proximal_mu,
            )
        prior = frequency_prior(inputs.public.images, len(tokens), len(sent))
        return WordsLeak(tokens, prior, time.perf_counter() - start)
