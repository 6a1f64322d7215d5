"""DAGER's span check (Petrov, Dimitrov, Baader, Müller, Vechev, NeurIPS 2024): a batch's
token sequences read exactly off a causal transformer's attention-weight gradients.

For a linear map ``Z = X W^T`` of the rows of ``X`` (one per token of the batch), the weight
gradient ``dL/dW = (dL/dZ)^T X`` has rank at most the batch's token count and its row space
is spanned by the rows of ``X``. At the first attention layer of a pre-norm transformer a row
of ``X`` is ``LN(E[v] + P[p])``: token ``v``'s embedding plus position ``p``'s, normalised.
So, while the batch holds fewer tokens than the width,

1. **tokens** (layer 0): the ``(v, p)`` pairs whose input lies in the gradient's row space
   (projection residual below ``residual_tolerance``) are exactly the batch's tokens at
   position ``p``;
2. **sequences** (layer 1, the paper's decoder variant): a causal layer-1 input at position
   ``p`` depends on the tokens ``0..p`` only, so prefixes grow one position at a time,
   keeping each extension whose layer-1 input lies in layer 1's gradient span.

The q, k and v weight gradients of a layer are stacked (``in_proj_weight`` holds all three):
a position's query gradient can vanish (the first position attends only to itself) while its
key and value gradients do not. LayerNorm leaves inputs in a ``width - 1`` dimensional
subspace, so the check needs fewer than ``width - 2`` tokens in the batch (:func:`token_limit`).

The attacker knows the architecture and the weights it sent; it reads only the two layers'
gradients. Differences from the paper's code (eth-sri/dager-gradient-inversion, read, not
copied): fedsim's transformer is PyTorch's pre-norm ``TransformerEncoderLayer``, so the layer
inputs are ``norm1`` of the residual stream; the rank is read from the singular values at a
stated relative tolerance (``rank_tolerance``) and the residual is relative to the input's
norm; prefixes are all kept while they pass (no beam cap below ``max_prefixes``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedsim.core.params.analytic import DagerParams
from fedsim.text.models import TransformerBody


def token_limit(width: int) -> int:
    """Fewer tokens than this in a batch for the span check to tell: LayerNorm's outputs span
    ``width - 1`` dimensions, and a gradient span one short of them (measured: a batch of
    ``width`` tokens gave rank ``width - 2``) admits nearly every candidate."""
    return width - 2


def attention_weight(body: TransformerBody, layer: int) -> str:
    """The name, within ``body``, of layer ``layer``'s stacked q, k, v projection weight."""
    return f"blocks.layers.{layer}.self_attn.in_proj_weight"


def row_space(gradient: torch.Tensor, rank_tolerance: float) -> torch.Tensor:
    """An orthonormal basis ``(d, r)`` of ``gradient``'s row space (``gradient`` ``(m, d)``)."""
    _, singular, right = torch.linalg.svd(gradient.double(), full_matrices=False)
    rank = int((singular > rank_tolerance * singular[0]).sum()) if len(singular) else 0
    return right[:rank].T


def residuals(inputs: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Each row's distance to the span of ``basis``, relative to its norm."""
    inputs = inputs.double()
    projected = (inputs @ basis) @ basis.T
    return (inputs - projected).norm(dim=-1) / inputs.norm(dim=-1).clamp_min(1e-30)


@torch.no_grad()
def layer_inputs(body: TransformerBody, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """``(B, T, d)``: what layer ``layer``'s attention projects at each position (its
    ``norm1`` of the residual stream), for token sequences ``(B, T)`` starting at position 0."""
    length = tokens.shape[1]
    positions = torch.arange(length, device=tokens.device)
    x = body.embedding(tokens) + body.position(positions)
    mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
    blocks = body.blocks.layers
    for block in blocks[:layer]:
        x = block(x, src_mask=mask, is_causal=True)
    return blocks[layer].norm1(x)


@dataclass(frozen=True)
class DagerResult:
    """Token sets per position (layer 0) and the sequences assembled from them (layer 1)."""

    sequences: torch.Tensor  # (S, T): every full-length sequence that passed layer 1
    tokens_at: tuple[tuple[int, ...], ...]  # per position, the tokens that passed layer 0
    ranks: tuple[int, int]  # the two layers' gradient ranks
    prefixes_cut: bool  # stopped: more than max_prefixes partial sequences passed
    span_full: bool = False  # a rank at token_limit or above: (nearly) every input passes

    @property
    def found(self) -> bool:
        return len(self.sequences) > 0


@torch.no_grad()
def dager(
    body: TransformerBody,
    gradients: tuple[torch.Tensor, torch.Tensor],
    length: int,
    params: DagerParams,
) -> DagerResult:
    """The sequences of ``length`` tokens whose inputs lie in both layers' gradient spans.

    ``gradients``: the weight gradients of :func:`attention_weight` of layers 0 and 1, at the
    weights ``body`` holds.
    """
    first, second = (row_space(g, params.rank_tolerance) for g in gradients)
    ranks = (first.shape[1], second.shape[1])
    if max(ranks) >= token_limit(body.embedding.embedding_dim):
        # LayerNorm's outputs span width - 1 dimensions: a span that fills them tells nothing.
        return DagerResult(torch.zeros(0, length, dtype=torch.long), (), ranks, False, True)
    device = body.embedding.weight.device
    first, second = first.to(device), second.to(device)
    norm = body.blocks.layers[0].norm1
    tokens_at = []
    for position in range(length):
        # A position's layer-0 input depends on its own token only.
        found = residuals(norm(body.embedding.weight + body.position.weight[position]), first)
        tokens_at.append(tuple(int(t) for t in (found < params.residual_tolerance).nonzero()))
    prefixes = torch.zeros(1, 0, dtype=torch.long, device=device)
    cut = False
    for position in range(length):
        candidates = torch.tensor(tokens_at[position], dtype=torch.long, device=device)
        if not len(prefixes) or not len(candidates):
            prefixes = prefixes.new_zeros((0, position + 1))
            continue
        passed = residuals(extended_inputs(body, prefixes, candidates), second)
        keep = (passed < params.residual_tolerance).nonzero()
        prefixes = torch.cat([prefixes[keep[:, 0]], candidates[keep[:, 1]].unsqueeze(1)], dim=1)
        if len(prefixes) > params.max_prefixes:
            prefixes, cut = prefixes.new_zeros((0, length)), True
            break
    return DagerResult(prefixes.cpu(), tuple(tokens_at), ranks, cut)


def extended_inputs(
    body: TransformerBody, prefixes: torch.Tensor, candidates: torch.Tensor
) -> torch.Tensor:
    """``(S, C, d)``: layer 1's attention input at position ``p`` for every prefix ``(S, p)``
    extended by every candidate token ``(C,)``; equal to ``layer_inputs(seq, 1)[:, p]``.

    Causal attention lets the prefixes' keys and values be computed once, and only the new
    position's query, attention and feed-forward per pair (the paper's decoder variant
    re-runs whole sequences).
    """
    block, length = body.blocks.layers[0], prefixes.shape[1]
    attention = block.self_attn
    heads, width = attention.num_heads, body.embedding.embedding_dim
    project = attention.in_proj_weight.view(3, width, width)
    bias = attention.in_proj_bias.view(3, width)
    before = body.embedding(prefixes) + body.position.weight[:length]  # (S, p, d)
    new = body.embedding(candidates) + body.position.weight[length]  # (C, d)
    keys, values = (block.norm1(before) @ project[i].T + bias[i] for i in (1, 2))
    query, key, value = (block.norm1(new) @ project[i].T + bias[i] for i in (0, 1, 2))

    def split(t: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., heads, d / heads)
        return t.unflatten(-1, (heads, width // heads))

    scale = (width // heads) ** -0.5
    earlier = torch.einsum("chk,sphk->schp", split(query), split(keys)) * scale
    own = (split(query) * split(key)).sum(-1).unsqueeze(0).unsqueeze(-1) * scale  # (1, C, h, 1)
    weights = torch.softmax(torch.cat([earlier, own.expand(len(prefixes), -1, -1, -1)], -1), -1)
    mixed = torch.einsum("schp,sphk->schk", weights[..., :-1], split(values))
    mixed = mixed + weights[..., -1:] * split(value).unsqueeze(0)
    x = new + attention.out_proj(mixed.flatten(-2))  # (S, C, d)
    x = x + block.linear2(block.activation(block.linear1(block.norm2(x))))
    return body.blocks.layers[1].norm1(x)
