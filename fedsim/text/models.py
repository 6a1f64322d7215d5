"""Text models: LEAF's character LSTM and a small causal transformer.

Each maps a ``(B, T)`` LongTensor of token ids to ``(B, T, V)`` logits and is a
:class:`~fedsim.core.models.SplitNet`: the extractor holds the token embedding
(:data:`TOKEN_EMBEDDING`) and the body, the classifier is the output layer
(:data:`OUTPUT_WEIGHT`, :data:`OUTPUT_BIAS`). FedSplit shares the output layer
only; the embedding and body stay on the client. The spec's ``image_size`` is
the window length, ``num_classes`` the vocabulary's size.
"""

from __future__ import annotations

import torch
from torch import nn

from fedsim.core.modality import TEXT
from fedsim.core.models import MODELS, InputSpec, ModelBuilder, SplitNet

TOKEN_EMBEDDING = "extractor.embedding.weight"
OUTPUT_WEIGHT = "classifier.weight"
OUTPUT_BIAS = "classifier.bias"
WORD_TRANSFORMER_WIDTH = 128


def attention_weight_name(layer: int) -> str:
    """A :class:`TransformerBody` model's parameter name of layer ``layer``'s stacked q, k, v
    projection weight (what DAGER reads)."""
    return f"extractor.blocks.layers.{layer}.self_attn.in_proj_weight"


def attention_width(name: str) -> int | None:
    """The width of the causal :class:`TransformerBody` that model ``name`` is built on, as
    its builder declares (``attention_width``); ``None`` for a model without one (an LSTM,
    an image model): nothing for an attack on attention-weight gradients to read."""
    width = getattr(MODELS.get(name), "attention_width", None)
    return int(width) if width is not None else None


class LstmBody(nn.Module):
    """Token embedding, then stacked LSTM layers: ``(B, T)`` -> ``(B, T, hidden)``."""

    def __init__(self, vocabulary: int, embedding: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=layers, batch_first=True)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lstm(self.embedding(tokens))[0]


class TransformerBody(nn.Module):
    """Token and position embeddings, causal pre-norm blocks, a final norm."""

    def __init__(self, vocabulary: int, length: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.position = nn.Embedding(length, width)
        block = nn.TransformerEncoderLayer(
            width, heads, 2 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        x = self.embedding(tokens) + self.position(positions)
        return self.norm(self.blocks(x, mask=mask, is_causal=True))


def _text_model(builder: ModelBuilder) -> ModelBuilder:
    builder.modality = TEXT  # type: ignore[attr-defined]
    return builder


@MODELS.register("char-lstm")
@_text_model
def char_lstm(spec: InputSpec) -> SplitNet:
    """LEAF's and FedProx's Shakespeare LSTM: embedding 8, two LSTM layers of 256."""
    body = LstmBody(spec.num_classes, 8, 256, 2)
    return SplitNet(body, nn.Linear(256, spec.num_classes))


@MODELS.register("word-transformer")
@_text_model
def word_transformer(spec: InputSpec) -> SplitNet:
    """A small causal transformer: width 128, 2 layers, 4 heads, token and position embeddings."""
    width = WORD_TRANSFORMER_WIDTH
    body = TransformerBody(spec.num_classes, spec.image_size, width, 2, 4)
    return SplitNet(body, nn.Linear(width, spec.num_classes))


word_transformer.attention_width = WORD_TRANSFORMER_WIDTH  # type: ignore[attr-defined]
