"""DAGER's span check on fedsim's causal transformer and real Shakespeare lines: exact
sequences below the rank limit, nothing at it, nothing from another client's gradient."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedsim.core.params.analytic import DagerParams
from fedsim.text.dager import attention_weight, dager, extended_inputs, layer_inputs, token_limit
from fedsim.text.models import TransformerBody
from fedsim.text.shakespeare import roles
from fedsim.text.tokens import Vocabulary, windows, word_vocabulary


@functools.lru_cache(maxsize=1)
def _corpus() -> tuple[Vocabulary, np.ndarray]:
    spoken = [role.text for role in roles()[:200]]
    vocabulary = word_vocabulary(spoken, 2000)
    return vocabulary, np.concatenate([vocabulary.encode(text) for text in spoken])


def _probe(
    width: int, batch: int, length: int, seed: int, other: int | None = None
) -> tuple[TransformerBody, tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A random-init transformer, a batch of real word windows and the probe's gradients of
    the two first attention layers (of batch ``other`` when given: another client's)."""
    vocabulary, ids = _corpus()
    torch.manual_seed(seed)
    body = TransformerBody(len(vocabulary), 64, width, 2, 4)
    head = torch.nn.Linear(width, len(vocabulary))
    every = windows(ids, length)
    order = torch.randperm(len(every), generator=torch.Generator().manual_seed(seed))
    batches = [torch.from_numpy(every[order[k * batch : (k + 1) * batch].numpy()]) for k in (0, 1)]
    observed = batches[0 if other is None else 1]
    loss = F.cross_entropy(head(body(observed[:, :-1])).flatten(0, 1), observed[:, 1:].flatten())
    weights = dict(body.named_parameters())
    grads = torch.autograd.grad(loss, [weights[attention_weight(body, i)] for i in (0, 1)])
    return body, (grads[0], grads[1]), batches[0][:, :-1]


def test_extended_inputs_equal_a_full_forward() -> None:
    body, _, truth = _probe(64, 2, 8, seed=0)
    prefixes, candidates = truth[:, :5], torch.tensor([3, 17, 250])
    fast = extended_inputs(body, prefixes, candidates)
    for s in range(len(prefixes)):
        full = torch.cat([prefixes[s].repeat(3, 1), candidates.unsqueeze(1)], dim=1)
        slow = layer_inputs(body, full, 1)[:, -1]
        torch.testing.assert_close(fast[s], slow, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("batch", "length"), [(1, 32), (2, 32), (4, 32), (8, 16)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dager_recovers_every_sequence_below_half_the_width(
    batch: int, length: int, seed: int
) -> None:
    body, grads, truth = _probe(256, batch, length, seed)
    assert batch * length <= 256 // 2

    result = dager(body, grads, length, DagerParams())

    assert {tuple(s) for s in result.sequences.tolist()} == {tuple(s) for s in truth.tolist()}
    assert not result.prefixes_cut and not result.span_full


def test_dager_tells_nothing_once_the_tokens_fill_the_width() -> None:
    width, batch, length = 128, 8, 32  # 256 tokens, limit 126
    body, grads, _ = _probe(width, batch, length, seed=0)
    assert batch * length > token_limit(width)

    result = dager(body, grads, length, DagerParams())

    assert result.span_full and not result.found

    at_width = dager(*_probe(width, 4, 32, seed=0)[:2], 32, DagerParams())  # 128 tokens
    assert not at_width.found


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_another_clients_gradient_recovers_none_of_this_batch(seed: int) -> None:
    body, grads, truth = _probe(256, 4, 32, seed, other=1)

    result = dager(body, grads, 32, DagerParams())

    assert result.found  # the other batch's sequences
    assert not {tuple(s) for s in result.sequences.tolist()} & {tuple(s) for s in truth.tolist()}


def test_params_refuse_out_of_range_tolerances() -> None:
    with pytest.raises(ValueError, match=r"residual-tolerance must be in \(0, 1\)"):
        DagerParams(residual_tolerance=0.0)
    with pytest.raises(ValueError, match="max-prefixes must be >= 1"):
        DagerParams(max_prefixes=0)
